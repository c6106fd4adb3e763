"""Every artifact is bound to the model and windows it came from (``results.binding``), and every reader refuses
one bound to others in one line: the profiles file and the per-token files carry the binding in their own
metadata, ``downstream.json`` is checked against the ``audit.json`` beside it, ``fca eval --out`` into another
model's audit folder and an export from an ``audit.json`` edited to claim the source stop before any work."""

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, fca
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import fca_workbench
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.cli import main
from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import read_documents
from fca_workbench.export import export_static
from fca_workbench.export.card import card_binding
from fca_workbench.foundation.errors import UserError
from fca_workbench.results import frames
from fca_workbench.results.binding import BINDING_KEY, audit_binding, binding, check_folder_binding, parse_binding
from fca_workbench.results.layout import AUDIT_FILE, DOWNSTREAM_FILE, PER_TOKEN_CSV, PER_TOKEN_PARQUET, PROFILES_FILE
from fca_workbench.results.per_token import per_token_binding
from fca_workbench.results.profiles import load_profiles, save_profiles
from fca_workbench.viewmodel.downstream import downstream_tables

TEXT_CHARS = 4000  # of each shipped split: a few windows of 32 tokens
AUDIT = dict(window=32, max_windows=2, batch_size=2, resamples=20, latency_repeats=1)
MODELS = ("featuregate", "muddpythia")


@pytest.fixture(scope="module")
def audits(tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """An audit of the tiny FeatureGate and one of the tiny MUDDPythia: two models, the same windows."""
    root = tmp_path_factory.mktemp("bound")
    texts = {}
    for split in ("eval", "calibration"):
        texts[split] = root / f"{split}.txt"
        texts[split].write_text(read_documents(split_path(split))[0][:TEXT_CHARS], encoding="utf-8")
    folders = {}
    for name in MODELS:
        folders[name] = root / name
        settings = AuditSettings(
            str(tiny_checkpoints[name]), eval=str(texts["eval"]), calibration=str(texts["calibration"]), **AUDIT
        )
        run_audit(settings, folders[name])
    return folders


def copied(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to, ignore=shutil.ignore_patterns("cache")))


def audit_json(folder: Path) -> dict:
    return json.loads((folder / AUDIT_FILE).read_text())


def edit_audit(folder: Path, change) -> None:
    audit = audit_json(folder)
    change(audit)
    (folder / AUDIT_FILE).write_text(json.dumps(audit))


def one_line(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_the_audits_files_record_the_binding_of_its_audit_json(audits):
    folder = audits["featuregate"]
    audit = audit_json(folder)
    with safe_open(folder / PROFILES_FILE, "pt") as handle:
        recorded = parse_binding(handle.metadata()[BINDING_KEY], "profiles")
    assert (
        recorded
        == audit_binding(audit, ["calibration"])
        == binding(audit["model"]["fingerprint"], {"calibration": audit["data"]["calibration"]["fingerprint"]})
    )
    for name in (PER_TOKEN_CSV, PER_TOKEN_PARQUET):
        assert per_token_binding(folder / name) == audit_binding(audit)
    assert gzip.decompress((folder / PER_TOKEN_CSV).read_bytes()).startswith(b"window,position,target_token,")
    results = fca_workbench.load_audit(folder)
    assert len(results.per_token) and set(load_profiles(folder / PROFILES_FILE)) >= {"layer_mean", "global_mean"}


def test_eval_into_another_models_audit_folder_is_refused_before_the_calibration_capture(
    audits, tiny_checkpoints, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("lm_eval")
    from fca_workbench.audit import session as session_module

    def no_capture(*args, **kwargs):
        raise AssertionError("fca eval captured calibration windows for another model's audit folder")

    monkeypatch.setattr(session_module, "capture", no_capture)
    other = copied(audits["muddpythia"], tmp_path / "muddpythia")
    before = sorted(p.name for p in other.iterdir())
    argv = ["eval", str(tiny_checkpoints["featuregate"]), "--tasks", "fca_next_line", "--limit", "2"]
    assert main([*argv, "--max-windows", "2", "--out", str(other)]) == 2
    err = capsys.readouterr().err  # besides the error, only the datasets library's progress lines
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Generating test split")]
    assert len(lines) == 1 and lines[0].startswith("fca: error:") and "Traceback" not in err, lines
    assert f"the audit in {other} is of another model" in lines[0] and "choose another --out" in lines[0]
    assert sorted(p.name for p in other.iterdir()) == before and not (other / DOWNSTREAM_FILE).exists()
    check_folder_binding(other, audit_json(other)["model"]["fingerprint"])  # its own model: passes
    check_folder_binding(tmp_path / "new", "0" * 64)  # no audit.json: passes


def test_an_export_from_an_audit_json_edited_to_claim_the_source_is_refused(audits, tiny_checkpoints, tmp_path):
    source = tiny_checkpoints["featuregate"]
    claimed = copied(audits["muddpythia"], tmp_path / "claimed")
    fingerprint = audit_json(audits["featuregate"])["model"]["fingerprint"]
    edit_audit(claimed, lambda audit: audit["model"].update(fingerprint=fingerprint))
    result = fca("export", source, "--profile", "layer_mean", "--audit", claimed, "--out", tmp_path / "new")
    assert_one_line_error(result, f"{claimed}'s {PROFILES_FILE} is of another model", "this checkpoint")
    assert not (tmp_path / "new").exists()
    recalibrated = copied(audits["featuregate"], tmp_path / "recalibrated")
    edit_audit(recalibrated, lambda audit: audit["data"]["calibration"].update(fingerprint="0" * 64))
    with pytest.raises(UserError) as error:
        export_static(source, "layer_mean", tmp_path / "new", audit=recalibrated)
    one_line(error, f"{PROFILES_FILE} is of other calibration windows", "000000000000", "its audit.json")
    assert not (tmp_path / "new").exists()


def test_the_export_card_records_the_binding_its_profile_was_checked_against(audits, tiny_checkpoints, tmp_path):
    out = export_static(tiny_checkpoints["featuregate"], "layer_mean", tmp_path / "out", audit=audits["featuregate"])
    card = json.loads((out / "export_card.json").read_text())
    audit = audit_json(audits["featuregate"])
    assert card_binding(card) == audit_binding(audit, ["calibration"])
    readme = (out / "README.md").read_text()
    assert audit["model"]["fingerprint"] in readme and audit["data"]["calibration"]["fingerprint"] in readme


def downstream_of(fingerprint: str) -> dict:
    """A small valid ``downstream.json`` of the model with this fingerprint."""
    figure = {"value": 0.5, "stderr": 0.25, "gap": None, "retention": None}
    return {
        "schema": "fca-downstream/2",
        "model": {"path": "/elsewhere/model", "arch": "featuregate", "fingerprint": fingerprint},
        "settings": {
            "tasks": ["t"],
            "conditions": ["correct"],
            "limit": 2,
            "seed": 0,
            "dtype": "float32",
            "lm_eval": "0",
        },
        "calibration": {"fingerprint": "1" * 64},
        "tasks": {
            "t": {"samples": 2, "clusters": {"field": "play", "count": 1}, "conditions": {"correct": {"acc": figure}}}
        },
    }


def test_a_downstream_json_of_another_model_beside_an_audit_is_refused(audits, tmp_path):
    folder = copied(audits["featuregate"], tmp_path / "audit")
    audit = audit_json(folder)
    other = audit_json(audits["muddpythia"])["model"]["fingerprint"]
    (folder / DOWNSTREAM_FILE).write_text(json.dumps(downstream_of(other)))
    words = (f"{folder / DOWNSTREAM_FILE} is of another model", other[:12], "the audit.json beside it")
    with pytest.raises(UserError) as error:
        _ = fca_workbench.load_audit(folder).downstream
    one_line(error, *words)
    with pytest.raises(UserError) as error:
        downstream_tables(folder, audit)  # the dashboard's results view
    one_line(error, *words)
    (folder / DOWNSTREAM_FILE).write_text(json.dumps(downstream_of(audit["model"]["fingerprint"])))
    assert fca_workbench.load_audit(folder).downstream["value"].tolist() == [0.5]
    assert downstream_tables(folder, audit)[0]["value"].tolist() == [0.5]


def rewrite_profiles(folder: Path, metadata: dict | None) -> None:
    """The folder's profiles written again with ``metadata``, their new sha256 recorded in its audit.json, so
    only the binding can tell them apart."""
    path = folder / PROFILES_FILE
    save_file(load_file(path), path, metadata=metadata)
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    edit_audit(folder, lambda audit: audit["static_profiles"].update(sha256=sha256))


def test_a_profiles_file_bound_to_another_model_or_windows_is_refused(audits, tiny_checkpoints, tmp_path):
    folder = copied(audits["featuregate"], tmp_path / "audit")
    audit = audit_json(folder)
    model, calibration = audit["model"]["fingerprint"], audit["data"]["calibration"]["fingerprint"]
    cases = [
        (binding("2" * 64, {"calibration": calibration}), "is of another model: its model fingerprint 222222222222"),
        (binding(model, {"calibration": "3" * 64}), "is of other calibration windows"),
        (binding(model, {"eval": calibration}), "records no fingerprint of its calibration windows"),
        (None, "records no fingerprints of the model and data it came from"),
    ]
    for bound, words in cases:
        rewrite_profiles(folder, None if bound is None else {BINDING_KEY: json.dumps(bound)})
        with pytest.raises(UserError) as error:
            load_profiles(folder / PROFILES_FILE)
        one_line(error, f"{folder / PROFILES_FILE} {words}" if bound else words, "rerun fca audit")
        with pytest.raises(UserError) as error:
            export_static(tiny_checkpoints["featuregate"], "layer_mean", tmp_path / "new", audit=folder)
        one_line(error, words)
    rewrite_profiles(folder, {BINDING_KEY: "not json"})
    with pytest.raises(UserError) as error:
        load_profiles(folder / PROFILES_FILE)
    one_line(error, "is not valid JSON")
    save_profiles(folder / PROFILES_FILE, load_profiles(audits["featuregate"] / PROFILES_FILE), binding(model))
    with pytest.raises(UserError) as error:
        load_profiles(folder / PROFILES_FILE)
    one_line(error, "is not the file its audit wrote")  # the sha256 first: a file it did not write
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", [PER_TOKEN_PARQUET, PER_TOKEN_CSV])
def test_a_per_token_file_of_another_audit_is_refused(name, audits, tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "_has_pyarrow", lambda: name == PER_TOKEN_PARQUET)  # which file load_audit reads
    folder = copied(audits["featuregate"], tmp_path / "audit")
    shutil.copy(audits["muddpythia"] / name, folder / name)
    with pytest.raises(UserError) as error:
        _ = fca_workbench.load_audit(folder).per_token
    one_line(error, f"{folder / name} is of another model", "the audit.json beside it", "rerun fca audit")


def test_a_per_token_csv_written_before_the_binding_is_refused_with_a_rerun(audits, tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "_has_pyarrow", lambda: False)
    folder = copied(audits["featuregate"], tmp_path / "audit")
    text = gzip.decompress((folder / PER_TOKEN_CSV).read_bytes())
    (folder / PER_TOKEN_CSV).write_bytes(gzip.compress(text, mtime=0))  # the same table, no comment: an old file
    with pytest.raises(UserError) as error:
        _ = fca_workbench.load_audit(folder).per_token
    one_line(error, "records no fingerprints of the model and data", "rerun fca audit")
    (folder / PER_TOKEN_CSV).write_bytes(b"not gzip")
    with pytest.raises(UserError) as error:
        _ = fca_workbench.load_audit(folder).per_token
    one_line(error, f"{folder / PER_TOKEN_CSV} cannot be read", "not a gzip file")
