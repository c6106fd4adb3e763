"""An exported static model (``fca_workbench.export``) evaluated by lm-eval's own ``hf`` model scores what ``fca
eval --conditions P`` scores on its source: the export is the frozen model of that profile."""

import json

import pytest

from fca_workbench import export
from fca_workbench.cli import main
from fca_workbench.results.layout import DOWNSTREAM_FILE

pytest.importorskip("lm_eval")

SHIPPED = "data/checkpoints/featuregate-s0"
LIMIT, CALIBRATION_WINDOWS = 24, 4


@pytest.mark.parametrize("profile", ["layer_mean", "global_mean", "layer_scalar"])
def test_an_export_scores_what_fca_eval_scores_under_its_profile(profile, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from fca_workbench.downstream.evaluation import local_task_config, local_tasks

    folder = export.export_static(SHIPPED, profile, tmp_path / "export", max_windows=CALIBRATION_WINDOWS)
    task = local_task_config(local_tasks()["fca_next_line"])
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(folder), "tokenizer": SHIPPED, "device": "cpu", "dtype": "float32"},
        tasks=[task],
        task_manager=TaskManager(include_defaults=False),
        limit=LIMIT,
        log_samples=False,
    )
    exported = results["results"]["fca_next_line"]["acc,none"]
    out = tmp_path / "eval"
    argv = ["eval", SHIPPED, "--tasks", "fca_next_line", "--conditions", profile, "--limit", str(LIMIT)]
    assert main([*argv, "--max-windows", str(CALIBRATION_WINDOWS), "--out", str(out)]) == 0
    downstream = json.loads((out / DOWNSTREAM_FILE).read_text())
    assert exported == pytest.approx(downstream["tasks"]["fca_next_line"]["conditions"][profile]["acc"]["value"])
