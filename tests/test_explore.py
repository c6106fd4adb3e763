"""The explorer notebook's lazy explorer: a model is opened when first asked for, with its eval capture only (the
calibration capture waits for a static condition), kept once opened, sharing captures with a full audit of
the same settings, and giving the audit's own numbers."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fca_workbench import load_audit
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.notebooks.reproduce import NotebookRun, ensure_audit


def notebook_run(root: Path, checkpoints) -> NotebookRun:
    return NotebookRun(
        checkpoints=[str(c) for c in checkpoints],
        window=64,
        max_windows=6,
        batch_size=3,
        per_layer=False,
        out=str(root / "out"),
        cache=str(root / "cache"),
        progress=False,
    )


def files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_a_model_is_opened_when_asked_with_its_eval_capture_only(tiny_checkpoints, tmp_path):
    checkpoint = tiny_checkpoints["featuregate"]
    run = notebook_run(tmp_path, [checkpoint, tiny_checkpoints["dense"]])
    assert not (tmp_path / "cache").exists()  # building the run opens nothing
    explorer = run.explorer(checkpoint)
    cache = Path(run.settings(checkpoint).cache)
    assert (cache / "eval" / "manifest.json").is_file() and not (cache / "calibration").exists()
    assert not list(run.audits.glob("*/audit.json")) and run.finished_audits() == []  # nothing was audited
    assert run.explorer(str(checkpoint) + "/") is explorer  # kept: the same checkpoint is not opened twice
    assert explorer.conditions[:3] == ("unperturbed", "correct", "cross_input") and explorer.routers == [False] * 2

    # a static profile captures the calibration set then: each slot's mean over every calibration token,
    # computed here from the model's own live coefficients
    layer_mean = explorer.coefficients("layer_mean", 0)
    assert (cache / "calibration" / "manifest.json").is_file()
    model = load_model(checkpoint)
    from fca_workbench.audit.inputs import audit_windows

    _, calibration = audit_windows(explorer.settings, "calibration", model, explorer.tokenizer)
    with torch.no_grad():
        _, values = model.capture_run(calibration)
    for layer, value in enumerate(values):
        expected = value["coefficient"].double().mean(dim=(0, 1)).float()
        assert layer_mean[layer].shape[0] == 64
        assert torch.allclose(layer_mean[layer], expected.expand_as(layer_mean[layer]), atol=1e-6)


def test_a_model_without_a_controller_is_a_one_line_error(tiny_checkpoints, tmp_path):
    run = notebook_run(tmp_path, [tiny_checkpoints["dense"]])
    with pytest.raises(UserError, match="dense has no controller"):
        run.explorer(tiny_checkpoints["dense"])


def test_the_explorer_reuses_a_full_audits_captures_and_gives_its_numbers(tiny_checkpoints, tmp_path):
    checkpoint = tiny_checkpoints["featuregate"]
    audited = notebook_run(tmp_path, [checkpoint, tiny_checkpoints["muddpythia"]])
    ensure_audit(audited.settings(checkpoint), audited.audit_dir(checkpoint))
    assert audited.finished_audits() == [audited.audit_dir(checkpoint)]  # the other checkpoint: not audited
    before = files(tmp_path / "cache")

    explorer = notebook_run(tmp_path, [checkpoint]).explorer(checkpoint)  # a new session, same settings
    explorer.coefficients("layer_mean", 0)
    assert files(tmp_path / "cache") == before  # both captures read back, not one file rewritten

    per_token = load_audit(audited.audit_dir(checkpoint)).per_token
    for condition in ("correct", "cross_input", "token_shuffle", "layer_mean", "global_mean"):
        expected = per_token[(per_token.window == 2) & (per_token.condition == condition)].sort_values("position")
        nll = explorer.token_nll(condition, 2)
        assert len(nll) == len(expected) == 63
        assert (nll - torch.tensor(expected.nll.to_numpy())).abs().max() < 1e-5, condition


@pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987_syntax is not installed")
def test_jsonschema_is_imported_without_the_slow_iri_checker():
    """rfc3987_syntax builds ~40 parsers at import (seconds): jsonschema is imported without it, still validates,
    and the library stays importable afterwards."""
    code = (
        "import sys\n"
        "from fca_workbench.foundation.files import import_jsonschema\n"
        "jsonschema = import_jsonschema()\n"
        "assert 'rfc3987_syntax' not in sys.modules, 'imported'\n"
        "try:\n"
        "    jsonschema.validate({'a': 1}, {'properties': {'a': {'type': 'string'}}})\n"
        "except jsonschema.ValidationError:\n"
        "    print('validated')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "validated"
