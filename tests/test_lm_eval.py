"""``fca lm-eval``: lm-eval's own command line with ``--model fca``, offline on a shipped task, its own results
and samples files, the binding beside them, and the same accuracy as ``fca eval`` on the same documents."""

import json
from dataclasses import replace

import pytest
import torch
from test_no_requests import assert_no_request, fca_logged

from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.data.corpus import DATA_DIR, split_path
from fca_workbench.data.windows import read_documents
from fca_workbench.downstream import require_lm_eval
from fca_workbench.foundation.errors import UserError

require_lm_eval()  # offline, before the harness imports lm-eval
from fca_workbench.downstream.harness import OPENED, FcaLM  # noqa: E402

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


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("texts") / "calibration.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:6000], encoding="utf-8")
    return str(path)


def test_an_audits_profile_answers_as_the_same_calibration_estimated_and_the_binding_names_the_audit(
    calibration, tmp_path
):
    settings = AuditSettings(str(CHECKPOINT), eval=calibration, calibration=calibration, max_windows=2)
    run_audit(replace(settings, batch_size=2, resamples=20, latency_repeats=1), tmp_path / "audit")
    ids = torch.randint(1, 4096, (2, 12), generator=torch.Generator().manual_seed(0))
    from_audit = FcaLM(str(CHECKPOINT), condition="layer_mean", audit=str(tmp_path / "audit"))
    assert OPENED[-1]["audit"] == str((tmp_path / "audit").resolve()) and OPENED[-1]["condition"] == "layer_mean"
    estimated = FcaLM(str(CHECKPOINT), condition="layer_mean", calib=calibration, max_windows=2)
    assert OPENED[-1]["audit"] is None
    assert torch.equal(from_audit._model_call(ids), estimated._model_call(ids))
    live = FcaLM(str(CHECKPOINT), calib=calibration, max_windows=2)
    assert OPENED[-1]["condition"] == "correct" and not torch.equal(live._model_call(ids), estimated._model_call(ids))


@pytest.mark.parametrize(
    ("model_args", "fragment"),
    [
        ({"condition": "token_shuffle"}, "needs a text's own cached values; fca lm-eval takes the static ones"),
        ({"condition": "nonsense"}, "is not a condition"),
    ],
)
def test_a_condition_a_task_cannot_be_answered_under_is_one_line(model_args, fragment):
    with pytest.raises(UserError, match=fragment) as caught:
        FcaLM(str(CHECKPOINT), **model_args)
    assert "\n" not in str(caught.value)
