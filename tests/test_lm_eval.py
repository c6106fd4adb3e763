"""``fca lm-eval``: lm-eval's own command line with ``--model fca``, offline on a shipped task, its own results
and samples files, the binding beside them, and the same accuracy as ``fca eval`` on the same documents."""

import json

from test_no_requests import assert_no_request, fca_logged

from fca_workbench.data.corpus import DATA_DIR

CHECKPOINT = DATA_DIR / "checkpoints" / "featuregate-s0"


def test_fca_lm_eval_runs_lm_evals_cli_offline_and_equals_fca_eval(tmp_path):
    model_args = f"checkpoint={CHECKPOINT},condition=layer_mean,max_windows=4"
    lm_eval = ["lm-eval", "--model", "fca", "--model_args", model_args, "--tasks", "fca_next_line", "--limit", "4"]
    result, seen = fca_logged(*lm_eval, "--output_path", str(tmp_path / "lm"), "--log_samples")
    assert_no_request(result, seen)
    [results] = list((tmp_path / "lm").rglob("results_*.json"))
    [binding_file] = list((tmp_path / "lm").rglob("fca_binding_*.json"))
    assert binding_file.parent == results.parent and list(results.parent.glob("samples_fca_next_line_*.jsonl"))
    figures, binding = json.loads(results.read_text()), json.loads(binding_file.read_text())
    assert figures["results"]["fca_next_line"]["acc,none"] is not None

    fca_eval = ["eval", str(CHECKPOINT), "--tasks", "fca_next_line", "--limit", "4", "--max-windows", "4"]
    assert_no_request(*fca_logged(*fca_eval, "--conditions", "layer_mean", "--out", str(tmp_path / "eval")))
    downstream = json.loads((tmp_path / "eval" / "downstream.json").read_text())
    expected = downstream["tasks"]["fca_next_line"]["conditions"]["layer_mean"]["acc"]["value"]
    assert figures["results"]["fca_next_line"]["acc,none"] == expected
    assert figures["n-samples"]["fca_next_line"]["effective"] == downstream["tasks"]["fca_next_line"]["samples"]
    assert binding["model"]["fingerprint"] == downstream["model"]["fingerprint"]
    assert (binding["condition"], binding["audit"], binding["results"]) == ("layer_mean", None, results.name)
    assert binding["calibration"]["fingerprint"] == downstream["calibration"]["fingerprint"]
