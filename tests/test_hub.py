"""Hub names ``ORG/NAME[@REVISION]`` resolved offline from a Hugging Face cache laid out exactly as
huggingface_hub lays it out (``models--org--name/snapshots/<sha>/`` files as symlinks into ``blobs/``,
``refs/<branch>`` holding the sha), in a temporary ``HF_HOME`` with ``HF_HUB_OFFLINE=1``."""

import hashlib
import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from conftest import assert_one_line_error, fca, refused_before_anything

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.many import audit_names
from fca_workbench.audit.run import default_out
from fca_workbench.foundation.checkpoint import checkpoint_name, hub_requests, recorded_name, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks.notebook_run import NotebookRun
from fca_workbench.results.schema import validate_audit
from fca_workbench.viewmodel.pool import Registry

pytestmark = pytest.mark.timeout(300)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def cache_snapshot(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """``folder``'s files stored as huggingface_hub stores a downloaded snapshot; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot, blobs = repo / "snapshots" / commit, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir(exist_ok=True)
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        (blobs / blob).write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob)
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


def write_tree(snapshot: Path, names: list[str]) -> Path:
    """The tree listing huggingface_hub caches for a snapshot it downloaded (``trees/<sha>.json``), naming
    ``names`` of the snapshot's files (sizes and blob ids as the hub gives them)."""
    files = {}
    for name in names:
        payload = (snapshot / name).read_bytes() if (snapshot / name).exists() else b""
        files[name] = {"size": len(payload), "blob_id": hashlib.sha1(payload).hexdigest()}
    tree = snapshot.parent.parent / "trees" / f"{snapshot.name}.json"
    tree.parent.mkdir(exist_ok=True)
    tree.write_text(json.dumps({"format_version": 1, "files": files}))
    return tree


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty hub cache under a temporary ``HF_HOME``, offline, for this process and the ``fca`` it starts: the
    user's environment as a process starts with it, so the hub settings an earlier test's local folder turned off
    are put back first (``hub_requests``)."""
    hub_requests(True)
    home = tmp_path / "hf"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_cached_hub_name_loads_the_snapshot_and_says_which_commit(offline_cache, tiny_checkpoints):
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    checkpoint = resolve_checkpoint("lab/fg")
    assert checkpoint.folder == snapshot and checkpoint.commit == COMMIT
    assert checkpoint.provenance() == {"id": "lab/fg", "revision": None, "commit": COMMIT}
    loaded = load_controlled("lab/fg").state_dict()
    reference = load_controlled(tiny_checkpoints["featuregate"]).state_dict()
    assert loaded.keys() == reference.keys() and all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_a_revision_is_a_branch_or_a_commit(offline_cache, tiny_checkpoints):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    other = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["dense"], OTHER_COMMIT, ref="v2")
    assert resolve_checkpoint("lab/fg@v2").folder == other
    assert resolve_checkpoint("lab/fg@v2").provenance() == {"id": "lab/fg", "revision": "v2", "commit": OTHER_COMMIT}
    assert resolve_checkpoint(f"lab/fg@{OTHER_COMMIT}").commit == OTHER_COMMIT
    assert load_controlled("lab/fg@v2").arch == "dense" and load_controlled("lab/fg").arch == "featuregate"


def test_a_name_missing_offline_is_one_line_saying_how_to_fetch_it(offline_cache, tiny_checkpoints, tmp_path):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    for name in ("lab/absent", "lab/fg@v9"):
        with pytest.raises(UserError, match="HF_HUB_OFFLINE is set") as error:
            resolve_checkpoint(name)
        assert "hf download " + name.split("@")[0] in str(error.value) and "\n" not in str(error.value)
        assert "'*.py'" not in str(error.value)
    result = fca("audit", "lab/absent@v1", "--out", tmp_path / "out")
    assert_one_line_error(
        result,
        "lab/absent@v1 is neither a folder nor in the Hugging Face cache",
        "hf download lab/absent --revision v1",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, why",
    [
        ("lab/na me", "valid hub name"),
        ("lab/na..me", "valid hub name"),
        ("lab--x/fg", "valid hub name"),
        ("lab/fg@/etc/passwd", "revision"),
        ("lab/fg@../../other", "revision"),
        ("lab/fg@main/../../x", "revision"),
        ("lab/fg@", "revision"),
        ("lab/fg@ma in", "revision"),
        ("lab/fg@" + "v" * 300, "revision"),
    ],
)
def test_malformed_hub_names_are_one_line(offline_cache, name, why):
    with pytest.raises(UserError, match=why):
        resolve_checkpoint(name)


def test_a_folder_wins_over_a_hub_name(offline_cache, tiny_checkpoints, tmp_path, monkeypatch):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_checkpoints["dense"], tmp_path / "lab" / "fg")
    checkpoint = resolve_checkpoint("lab/fg")
    assert checkpoint.folder == Path("lab/fg") and checkpoint.provenance() is None
    assert load_controlled("lab/fg").arch == "dense"
    with pytest.raises(UserError, match="checkpoint folder not found"):
        resolve_checkpoint("./lab/absent")  # shaped like a path: never looked up on the hub


def test_a_ref_leading_out_of_the_repository_is_refused(offline_cache, tiny_checkpoints):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    cache_snapshot(offline_cache, "lab/other", tiny_checkpoints["dense"], OTHER_COMMIT)
    (offline_cache / "models--lab--fg" / "refs" / "evil").write_text(
        f"../../models--lab--other/snapshots/{OTHER_COMMIT}"
    )
    with pytest.raises(UserError, match="refs/evil holds '../../models--lab--other/snapshots/.*not a commit hash"):
        resolve_checkpoint("lab/fg@evil")


def test_snapshot_links_may_lead_only_into_their_own_repository(offline_cache, tiny_checkpoints, tmp_path):
    """``blobs/`` of the snapshot's own repository is the one place a link may lead; another repository's
    blobs or a file elsewhere is refused before anything is read."""
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    other = cache_snapshot(offline_cache, "lab/other", tiny_checkpoints["featuregate"], OTHER_COMMIT)
    weights = snapshot / "model.safetensors"
    for target in (other / "model.safetensors", tiny_checkpoints["featuregate"] / "model.safetensors"):
        weights.unlink()
        weights.symlink_to(target.resolve())
        with pytest.raises(UserError, match="points outside the folder"):
            load_controlled("lab/fg")
    weights.unlink()  # a folder named snapshots/ outside a models--*/ cache folder gets no exception either
    plain = tmp_path / "lab-cache" / "snapshots" / COMMIT
    shutil.copytree(snapshot, plain, symlinks=True)
    shutil.copytree(snapshot.parent.parent / "blobs", plain.parent.parent / "blobs")
    with pytest.raises(UserError, match="points outside the folder"):
        load_controlled(plain)


def test_only_configs_weights_and_tokenizer_files_are_downloaded(offline_cache, tiny_checkpoints, monkeypatch):
    """Online, ``snapshot_download`` is asked for configs, safetensors and tokenizer files; code files only
    with ``trust_remote_code``."""
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    calls = []

    def download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("fca_workbench.foundation.checkpoint.snapshot_download", download)
    resolve_checkpoint("lab/fg@main")
    resolve_checkpoint("lab/fg", trust_remote_code=True)
    (_, plain), (_, code) = calls
    assert plain["local_files_only"] is False and plain["revision"] == "main"
    assert {"*.json", "*.safetensors"} <= set(plain["allow_patterns"]) and "*.py" not in plain["allow_patterns"]
    assert not any(pattern.endswith((".bin", ".pt", ".ckpt", ".pkl")) for pattern in plain["allow_patterns"])
    assert set(code["allow_patterns"]) - set(plain["allow_patterns"]) == {"*.py"}


def test_hub_names_give_safe_folder_names_and_labels(offline_cache, tiny_checkpoints, tmp_path):
    assert checkpoint_name("lab/fg") == "lab--fg" and checkpoint_name("lab/fg@refs/pr/1") == "lab--fg@refs--pr--1"
    assert default_out("lab/fg@v2") == Path("results/audit-lab--fg@v2")
    assert default_out(tiny_checkpoints["dense"]) == Path("results/audit-dense")
    assert audit_names(["lab/fg", "lab/fg@v2", "other/fg", "x/a/fg"]) == ["lab--fg", "lab--fg@v2", "other--fg", "fg"]
    with pytest.raises(UserError, match="given twice"):
        audit_names(["lab/fg", "lab/fg"])
    recorded = {"path": "/cache/snapshots/" + COMMIT, "hub": {"id": "lab/fg", "revision": "v2", "commit": COMMIT}}
    assert recorded_name(recorded) == "lab--fg@v2" and recorded_name({"path": "/x/featuregate-s0"}) == "featuregate-s0"

    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps(["lab/fg", str(tiny_checkpoints["dense"])]))
    assert Registry.from_file(registry).entries == {
        "lab--fg": offline_cache / "models--lab--fg" / "snapshots" / COMMIT,
        "dense": tiny_checkpoints["dense"],
    }
    registry.write_text(json.dumps({"mine": "lab/absent"}))
    with pytest.raises(UserError, match="hf download lab/absent"):
        Registry.from_file(registry)

    run = NotebookRun(checkpoints=["lab/fg", str(tiny_checkpoints["dense"])], out=str(tmp_path / "nb"))
    assert run.checkpoints[0] == "lab/fg" and run.audit_dir("lab/fg") == run.audits / "lab--fg"
    assert run.audit_dir({"model": recorded}) == run.audits / "lab--fg@v2"
    run.check()
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        NotebookRun(checkpoints=["lab/absent"], out=str(tmp_path / "nb")).check()


def test_audit_records_the_hub_id_and_commit(offline_cache, tiny_checkpoints, tmp_path):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    result = fca("audit", "lab/fg@main", "--max-windows", 4, "--resamples", 10, "--latency-repeats", 1, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    audit = json.loads((tmp_path / "results" / "audit-lab--fg@main" / "audit.json").read_text())
    assert audit["model"]["hub"] == {"id": "lab/fg", "revision": "main", "commit": COMMIT}
    assert audit["model"]["path"] == str(offline_cache / "models--lab--fg" / "snapshots" / COMMIT)
    assert audit["settings"]["checkpoint"] == "lab/fg@main"

    older = {k: v for k, v in audit["model"].items() if k != "hub"}  # audits written before keep loading
    validate_audit({**audit, "model": older})
    validate_audit({**audit, "model": {**older, "hub": None}})
    with pytest.raises(Exception, match="does not match"):
        validate_audit({**audit, "model": {**older, "hub": {"id": "lab/fg", "revision": None, "commit": "main"}}})


def test_a_snapshot_folder_that_is_a_link_out_of_its_cache_is_refused(
    offline_cache, tiny_checkpoints, tmp_path, capsys
):
    """A ``snapshots/<sha>`` link to a folder elsewhere (another checkpoint, another repository's snapshot)
    would audit that folder's weights under this hub id and commit."""
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    other = cache_snapshot(offline_cache, "lab/other", tiny_checkpoints["dense"], OTHER_COMMIT)
    shutil.rmtree(snapshot)
    for target in (tiny_checkpoints["dense"], other):
        snapshot.unlink(missing_ok=True)
        snapshot.symlink_to(target)
        with pytest.raises(UserError, match="is a link to"):
            resolve_checkpoint("lab/fg")
        refused_before_anything(
            ["audit", "lab/fg"], tmp_path / "out", capsys, "lab/fg", "not a folder of its own cache"
        )
    snapshot.unlink()  # the snapshots/ folder itself linked elsewhere is the same link
    snapshot.parent.rename(tmp_path / "moved")
    (offline_cache / "models--lab--fg" / "snapshots").symlink_to(other.parent)
    with pytest.raises(UserError, match="is a link to"):
        resolve_checkpoint(f"lab/fg@{OTHER_COMMIT}")


DAMAGED_TREES = {
    "nested 100,000 deep": b'{"files": ' * 100_000,
    "a JSON list": b"[]",
    "files a list": json.dumps({"format_version": 1, "files": ["config.json"]}).encode(),
    "an entry a number": json.dumps({"format_version": 1, "files": {"config.json": 5}}).encode(),
    "a xet hash a number": json.dumps(
        {"format_version": 1, "files": {"config.json": {"size": 1, "blob_id": "x", "xet_hash": 5}}}
    ).encode(),
    "not UTF-8": b"\xff\xfe{",
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_TREES))
def test_a_damaged_tree_listing_is_one_line(offline_cache, tiny_checkpoints, tmp_path, capsys, damage):
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    write_tree(snapshot, ["config.json"]).write_bytes(DAMAGED_TREES[damage])
    with pytest.raises(UserError, match=f"trees/{COMMIT}.json"):
        resolve_checkpoint("lab/fg")
    refused_before_anything(["audit", "lab/fg"], tmp_path / "out", capsys, "the Hugging Face cache of lab/fg")


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda ref: ref.write_bytes(b"\xff" * 40), "not UTF-8"),
        (lambda ref: ref.write_text(COMMIT + "\n" * 10_000), "larger than"),
        (lambda ref: ref.write_text("[" * 100), "not a commit hash"),
        (lambda ref: (ref.unlink(), ref.mkdir()), "is a folder"),
        (lambda ref: (ref.unlink(), ref.symlink_to("/etc/hostname")), "points outside"),
    ],
)
def test_a_damaged_ref_is_one_line(offline_cache, tiny_checkpoints, tmp_path, capsys, damage, why):
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    damage(offline_cache / "models--lab--fg" / "refs" / "main")
    refused_before_anything(["audit", "lab/fg"], tmp_path / "out", capsys, "refs/main", why)


def test_a_file_the_tree_lists_but_the_snapshot_lacks_is_named_as_missing(
    offline_cache, tiny_checkpoints, tmp_path, capsys
):
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    write_tree(snapshot, sorted(p.name for p in snapshot.iterdir()))
    assert resolve_checkpoint("lab/fg").folder == snapshot  # complete: the listing changes nothing
    (snapshot / "model.safetensors").unlink()
    line = refused_before_anything(
        ["audit", "lab/fg"],
        tmp_path / "out",
        capsys,
        "model.safetensors is missing from the cached snapshot of lab/fg",
        "HF_HUB_OFFLINE is set",
        "hf download lab/fg",
    )
    assert "neither a folder" not in line


def test_a_mistyped_hub_name_gets_the_closest_cached_name(offline_cache, tiny_checkpoints, tmp_path, capsys):
    cache_snapshot(offline_cache, "lab/featuregate", tiny_checkpoints["featuregate"])
    cache_snapshot(offline_cache, "lab/dense", tiny_checkpoints["dense"], OTHER_COMMIT)
    (offline_cache / "datasets--lab--featuregatee").mkdir()  # a dataset is no model to suggest
    refused_before_anything(
        ["audit", "lab/featuregatee"], tmp_path / "out", capsys, "did you mean lab/featuregate?", "hf download"
    )
    refused_before_anything(["audit", "labs/dense@main"], tmp_path / "out", capsys, "did you mean lab/dense?")
    for far in ("other/thing", "lab/dense@v9"):  # nothing close; a cached name whose revision is missing
        line = refused_before_anything(["audit", far], tmp_path / "out", capsys, "hf download")
        assert "did you mean" not in line
