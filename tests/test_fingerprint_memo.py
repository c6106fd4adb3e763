"""The model fingerprint: hashed in threads to the digest one thread computes, remembered in the cache root by
the checkpoint's file identity, taken again on any change to it, and never from a memo that fails its checks."""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fca_workbench.adapters import placement
from fca_workbench.audit import capture as capture_module
from fca_workbench.audit import fingerprint_memo
from fca_workbench.audit import session as session_module
from fca_workbench.audit.fingerprint_memo import (
    MEMO_FORMAT,
    MEMO_MAX_BYTES,
    checkpoint_identity,
    identity_key,
    read_memo,
    remembered_fingerprint,
)
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import LOADING_SETTINGS, ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.export.card import CARD_JSON
from fca_workbench.export.static import export_static
from fca_workbench.models import load_model
from fca_workbench.results.layout import FINGERPRINT_MEMO

WEIGHTS = "model.safetensors"


def serial_fingerprint(model) -> str:
    """The model fingerprint as its definition says, written out here in one thread: sha256 over the config
    (without ``_name_or_path``), then each state-dict entry's name and the sha256 of its shape, dtype and bytes."""
    fields = json.loads(model.config.to_json_string(use_diff=False))
    fields.pop("_name_or_path", None)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        own = hashlib.sha256(f"{tuple(tensor.shape)}|{tensor.dtype}".encode())
        own.update(tensor.detach().contiguous().numpy().tobytes())
        digest.update(name.encode())
        digest.update(own.hexdigest().encode())
    return digest.hexdigest()


@pytest.fixture(autouse=True)
def tiny_weights_remembered(monkeypatch):
    """The tiny checkpoints' weights are remembered as real ones are (below the threshold they are hashed)."""
    monkeypatch.setattr(fingerprint_memo, "MEMO_MIN_BYTES", 0)


@pytest.fixture
def folder(tiny_checkpoints, tmp_path) -> Path:
    """A copy of a tiny FeatureGate checkpoint, free to change."""
    return Path(shutil.copytree(tiny_checkpoints["featuregate"], tmp_path / "checkpoint"))


def settings(folder: Path, cache: Path) -> AuditSettings:
    return AuditSettings(str(folder), window=32, max_windows=4, batch_size=2, cache=str(cache))


def opened(folder: Path, cache: Path) -> str:
    return ReplaySession.open(settings(folder, cache), read_now=()).fingerprint


def test_the_weights_are_hashed_in_threads_to_the_one_thread_digest(tiny_checkpoints, monkeypatch):
    pools = []

    class Counted(placement.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(kwargs.get("max_workers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(placement, "HASH_THREADS", 4)
    monkeypatch.setattr(placement, "ThreadPoolExecutor", Counted)
    model = load_model(tiny_checkpoints["muddpythia"])
    assert capture_module.model_fingerprint(model) == serial_fingerprint(model)
    assert pools == [4]


def test_a_second_session_of_the_same_checkpoint_hashes_nothing(folder, tmp_path, fingerprint_calls):
    first = opened(folder, tmp_path / "cache")
    assert fingerprint_calls == ["FeatureGateForCausalLM"] and first == serial_fingerprint(load_model(folder))
    memo = json.loads((tmp_path / "cache" / FINGERPRINT_MEMO).read_text())
    assert memo["format"] == MEMO_FORMAT and [e["fingerprint"] for e in memo["checkpoints"].values()] == [first]
    assert opened(folder, tmp_path / "cache") == first
    assert len(fingerprint_calls) == 1  # remembered
    assert (
        opened(folder, tmp_path / "other cache") == first and len(fingerprint_calls) == 2
    )  # another cache root: its own


def rewrite_in_place(folder: Path) -> None:
    """The same size, times and inode: only the safetensors header differs (two bytes of its metadata)."""
    path = folder / WEIGHTS
    stat = path.stat()
    payload = bytearray(path.read_bytes())
    at = payload.index(b'"format":"pt"') + len('"format":"')
    payload[at : at + 2] = b"PT"
    with open(path, "r+b") as handle:
        handle.write(payload)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def touched(folder: Path) -> None:
    stat = (folder / WEIGHTS).stat()
    os.utime(folder / WEIGHTS, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def copied_over(folder: Path) -> None:
    shutil.copy2(folder / WEIGHTS, folder / "copy")  # same bytes and mtime, a new inode
    (folder / "copy").replace(folder / WEIGHTS)


def resaved(folder: Path) -> None:
    tensors = load_file(folder / WEIGHTS)
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt", "note": "x" * 64})


def chmodded(folder: Path) -> None:
    """Only the change time moves: what an in-place edit that restores the size and times leaves behind."""
    time.sleep(0.02)  # past the file system's clock tick
    os.chmod(folder / WEIGHTS, (folder / WEIGHTS).stat().st_mode)


def config_reformatted(folder: Path) -> None:
    config = folder / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()), indent=4))


CHANGES = {  # how each changes the file identity, and which field says so
    "ctime_ns": chmodded,
    "mtime_ns": touched,
    "inode": copied_over,
    "size": resaved,
    "header_sha256": rewrite_in_place,
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_each_weight_file_field_is_part_of_the_identity(folder, field):
    loading = {key: None for key in LOADING_SETTINGS}
    before = checkpoint_identity(folder, loading)
    assert before is not None
    CHANGES[field](folder)
    after = checkpoint_identity(folder, loading)
    assert after is not None and after["weights"][0][field] != before["weights"][0][field]
    assert identity_key(after) != identity_key(before)


def test_the_path_config_and_loading_are_part_of_the_identity(folder, tmp_path):
    loading = {key: None for key in LOADING_SETTINGS}
    before = checkpoint_identity(folder, loading)
    assert before is not None
    moved = checkpoint_identity(Path(shutil.copytree(folder, tmp_path / "moved", copy_function=shutil.copy2)), loading)
    assert moved is not None and moved["weights"][0]["path"] != before["weights"][0]["path"]
    assert checkpoint_identity(folder, {**loading, "dtype": "bfloat16"}) != before
    config_reformatted(folder)
    after = checkpoint_identity(folder, loading)
    assert after is not None and after["digests"]["config.json"] != before["digests"]["config.json"]


@pytest.mark.parametrize("change", [touched, chmodded, copied_over, resaved, config_reformatted, rewrite_in_place])
def test_any_change_to_the_checkpoint_hashes_again(folder, tmp_path, fingerprint_calls, change):
    first = opened(folder, tmp_path / "cache")
    change(folder)
    again = opened(folder, tmp_path / "cache")
    assert len(fingerprint_calls) == 2 and again == serial_fingerprint(load_model(folder))
    assert first == again  # the same weights and config fields: the same fingerprint, found by hashing
    assert (
        opened(folder, tmp_path / "cache") == again and len(fingerprint_calls) == 2
    )  # and remembered under the new identity


def test_a_checkpoint_in_another_folder_or_dtype_hashes_again(folder, tmp_path, fingerprint_calls):
    opened(folder, tmp_path / "cache")
    moved = Path(shutil.copytree(folder, tmp_path / "moved", copy_function=shutil.copy2))
    opened(moved, tmp_path / "cache")
    bf16 = ReplaySession.open(
        AuditSettings(str(folder), dtype="bfloat16", cache=str(tmp_path / "cache")), read_now=()
    ).fingerprint
    assert len(fingerprint_calls) == 3 and bf16 != opened(folder, tmp_path / "cache") and len(fingerprint_calls) == 3


def tampered_memos(path: Path) -> dict:
    """Ways a memo can be wrong, each written over the good one at ``path``."""
    good = json.loads(path.read_text())
    key, entry = next(iter(good["checkpoints"].items()))
    other = {**entry, "identity": {**entry["identity"], "loading": {"dtype": "float16"}}}
    return {
        "truncated": path.read_text()[:40],
        "not json": "\x00\xff garbage",
        "a list": "[]",
        "another format": json.dumps({**good, "format": "fca-fingerprint-memo/0"}),
        "a fingerprint that is no digest": json.dumps(
            {**good, "checkpoints": {key: {**entry, "fingerprint": "0" * 63 + "g"}}}
        ),
        "an entry under another identity's key": json.dumps({**good, "checkpoints": {key: other}}),
        "too large": json.dumps({**good, "padding": "x" * MEMO_MAX_BYTES}),
    }


def test_a_tampered_memo_is_ignored_and_rewritten(folder, tmp_path, fingerprint_calls):
    truth = opened(folder, tmp_path / "cache")
    path = tmp_path / "cache" / FINGERPRINT_MEMO
    for what, text in tampered_memos(path).items():
        path.write_text(text)
        assert opened(folder, tmp_path / "cache") == truth, what
        memo = read_memo(path)
        assert [e["fingerprint"] for e in memo.values()] == [truth], what
    assert len(fingerprint_calls) == 1 + len(tampered_memos(path))


def test_a_memo_claiming_another_fingerprint_under_a_forged_key_is_not_this_checkpoints(folder, tmp_path):
    """An entry's key is the digest of its identity: one filed under this checkpoint's key with another
    identity is dropped, and the true fingerprint is hashed."""
    loading = {key: None for key in LOADING_SETTINGS}
    identity = checkpoint_identity(folder, loading)
    assert identity is not None
    remembered_fingerprint(tmp_path, identity, lambda: "a" * 64)
    path = tmp_path / FINGERPRINT_MEMO
    memo = json.loads(path.read_text())
    key = next(iter(memo["checkpoints"]))
    memo["checkpoints"][key]["identity"]["loading"] = {"dtype": "float16"}
    path.write_text(json.dumps(memo))
    assert remembered_fingerprint(tmp_path, identity, lambda: "b" * 64) == "b" * 64


def test_a_model_in_memory_is_always_hashed(tiny_checkpoints, tmp_path, fingerprint_calls):
    """A model handed to a session (Python, a training run, the dashboard) is hashed every time, nothing kept."""
    model = load_model(tiny_checkpoints["featuregate"])
    for _ in range(2):
        assert ReplaySession(model, {}, cache_root=tmp_path).fingerprint == serial_fingerprint(model)
    assert len(fingerprint_calls) == 2 and not (tmp_path / FINGERPRINT_MEMO).exists()


def test_a_folder_without_safetensors_weights_or_with_small_ones_is_not_remembered(folder, monkeypatch):
    loading = {key: None for key in LOADING_SETTINGS}
    weights = (folder / WEIGHTS).stat().st_size
    monkeypatch.setattr(fingerprint_memo, "MEMO_MIN_BYTES", weights + 1)
    assert checkpoint_identity(folder, loading) is None and remembered_fingerprint(folder, None, lambda: "d" * 64)
    assert not (folder / FINGERPRINT_MEMO).exists()
    monkeypatch.setattr(fingerprint_memo, "MEMO_MIN_BYTES", weights)
    assert checkpoint_identity(folder, loading) is not None
    (folder / "pytorch_model.bin").write_bytes(b"")
    assert checkpoint_identity(folder, loading) is None
    empty = folder.parent / "no weights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert checkpoint_identity(empty, loading) is None


def test_a_checkpoint_changed_while_it_loads_is_not_remembered(folder, tmp_path, fingerprint_calls, monkeypatch):
    real = session_module.load_audit_model

    def changing(*args, **kwargs):
        loaded = real(*args, **kwargs)
        touched(folder)
        return loaded

    monkeypatch.setattr(session_module, "load_audit_model", changing)
    session = ReplaySession.open(settings(folder, tmp_path / "cache"), read_now=())
    assert not (tmp_path / "cache" / FINGERPRINT_MEMO).exists()
    assert session.fingerprint == serial_fingerprint(load_model(folder)) and len(fingerprint_calls) == 1


def test_a_memo_that_cannot_be_written_leaves_the_fingerprint_as_hashed(folder, tmp_path):
    loading = {key: None for key in LOADING_SETTINGS}
    identity = checkpoint_identity(folder, loading)
    assert identity is not None
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert remembered_fingerprint(blocked, identity, lambda: "c" * 64) == "c" * 64
    assert blocked.read_text() == ""


def test_an_export_from_an_audit_takes_the_fingerprint_the_audit_remembered(folder, tmp_path, fingerprint_calls):
    """``fca export --audit`` (like ``fca eval`` in an audit's folder) reads the memo of the audit's cache root,
    although its own captures go to a temporary folder: the weights are hashed once for both."""
    audit = run_audit(
        AuditSettings(str(folder), window=32, max_windows=4, batch_size=2, resamples=20, latency_repeats=1),
        tmp_path / "audit",
    )
    out = export_static(folder, "layer_mean", tmp_path / "export", audit=tmp_path / "audit")
    card = json.loads((out / CARD_JSON).read_text())
    assert card["source"]["fingerprint"] == audit["model"]["fingerprint"] == serial_fingerprint(load_model(folder))
    assert fingerprint_calls == ["FeatureGateForCausalLM"]


def sharded_into_a_subfolder(folder: Path) -> Path:
    """``folder``'s weights moved to a shard ``sub/a.safetensors`` its index names, beside a larger top-level
    safetensors file no loader reads; the shard's path."""
    shard = folder / "sub" / "a.safetensors"
    shard.parent.mkdir()
    tensors = load_file(folder / WEIGHTS)
    (folder / WEIGHTS).replace(shard)
    index = {"metadata": {}, "weight_map": {name: "sub/a.safetensors" for name in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({"unused": torch.zeros(1 << 16)}, folder / "unused.safetensors")
    return shard


def edited_in_place(shard: Path) -> None:
    """One weight's bytes changed in place, the size and both times put back: only the change time tells."""
    stat = shard.stat()
    header = 8 + int.from_bytes(shard.read_bytes()[:8], "little")
    with open(shard, "r+b") as handle:
        handle.seek(header)
        first = handle.read(4)
        handle.seek(header)
        handle.write(bytes(b ^ 0x01 for b in first))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    time.sleep(0.02)
    os.chmod(shard, stat.st_mode)


def test_a_shard_in_a_subfolder_is_part_of_the_identity(folder, tmp_path, fingerprint_calls):
    """The loader reads the shards the index names, wherever in the folder: a weight of one edited in place
    (size and times kept) is hashed again, not given the pre-edit fingerprint."""
    shard = sharded_into_a_subfolder(folder)
    first = opened(folder, tmp_path / "cache")
    identity = checkpoint_identity(folder, {key: None for key in LOADING_SETTINGS})
    assert identity is not None and str(shard.resolve()) in [f["path"] for f in identity["weights"]]
    edited_in_place(shard)
    again = opened(folder, tmp_path / "cache")
    assert len(fingerprint_calls) == 2 and again != first and again == serial_fingerprint(load_model(folder))


def test_an_index_naming_a_shard_outside_the_folder_is_not_remembered(folder, tmp_path):
    sharded_into_a_subfolder(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../elsewhere.safetensors"}}))
    assert checkpoint_identity(folder, {key: None for key in LOADING_SETTINGS}) is None


@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_a_memo_that_is_a_link_is_not_read(folder, tmp_path, fingerprint_calls, capsys, link):
    """A memo planted elsewhere and linked into the cache root, claiming another fingerprint for this very
    identity, is ignored with one line: the true fingerprint is hashed."""
    truth = opened(folder, tmp_path / "cache")
    path = tmp_path / "cache" / FINGERPRINT_MEMO
    planted = json.loads(path.read_text())
    for entry in planted["checkpoints"].values():
        entry["fingerprint"] = "e" * 64
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(planted))
    path.unlink()
    link(elsewhere, path)
    capsys.readouterr()
    assert read_memo(path) == {}
    assert opened(folder, tmp_path / "cache") == truth and len(fingerprint_calls) == 2
    warned = [line for line in capsys.readouterr().err.splitlines() if "fingerprint memo" in line]
    assert warned and all("a link" in line for line in warned)
    assert json.loads(elsewhere.read_text()) == planted  # never written through the link either
