"""An exported static model (``fca_workbench.export``) evaluated by lm-eval's own ``hf`` model scores what ``fca
eval --conditions P`` scores on its source: the export is the frozen model of that profile. lm-eval's own command
line runs the shipped tasks from any folder (``--include_path <checkout>/data/tasks``)."""

import json
import os
import subprocess
import sys

import pytest

from fca_workbench import export
from fca_workbench.cli import main
from fca_workbench.data.tasks import TASKS_DIR
from fca_workbench.results.layout import DOWNSTREAM_FILE

pytest.importorskip("lm_eval")

SHIPPED = "data/checkpoints/featuregate-s0"
LIMIT, CALIBRATION_WINDOWS = 24, 4


def fca_eval(profile: str, out) -> float:
    """``fca eval``'s accuracy of the shipped FeatureGate on ``fca_next_line`` under ``profile``."""
    argv = ["eval", SHIPPED, "--tasks", "fca_next_line", "--conditions", profile, "--limit", str(LIMIT)]
    assert main([*argv, "--max-windows", str(CALIBRATION_WINDOWS), "--out", str(out)]) == 0
    downstream = json.loads((out / DOWNSTREAM_FILE).read_text())
    return downstream["tasks"]["fca_next_line"]["conditions"][profile]["acc"]["value"]


@pytest.mark.parametrize("profile", ["layer_mean", "global_mean", "layer_scalar"])
def test_an_export_scores_what_fca_eval_scores_under_its_profile(profile, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = export.export_static(SHIPPED, profile, tmp_path / "export", max_windows=CALIBRATION_WINDOWS)
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(folder), "tokenizer": SHIPPED, "device": "cpu", "dtype": "float32"},
        tasks=["fca_next_line"],
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        limit=LIMIT,
        log_samples=False,
    )
    exported = results["results"]["fca_next_line"]["acc,none"]
    assert exported == pytest.approx(fca_eval(profile, tmp_path / "eval"))


def test_lm_evals_own_command_line_runs_the_shipped_task_from_any_folder(tmp_path):
    """``python -m lm_eval`` in a new empty folder, the shipped tasks named by ``--include_path`` alone, on an
    export that plain transformers loads: the accuracy ``fca eval`` gives for its profile."""
    folder = export.export_static(SHIPPED, "layer_mean", tmp_path / "export", max_windows=CALIBRATION_WINDOWS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--tasks", "fca_next_line"]
    command += [
        "--model_args",
        f"pretrained={folder},dtype=float32",
        "--device",
        "cpu",
        "--include_path",
        str(TASKS_DIR),
    ]
    command += ["--limit", str(LIMIT), "--output_path", "results"]
    offline = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=elsewhere, env=offline)
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = (elsewhere / "results").rglob("results_*.json")
    accuracy = json.loads(written.read_text())["results"]["fca_next_line"]["acc,none"]
    assert accuracy == pytest.approx(fca_eval("layer_mean", tmp_path / "eval"))
