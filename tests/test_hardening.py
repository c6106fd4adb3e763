"""Attacks and careless uses (issue 16): planted pickles, damaged caches, absurd configs, output folders the
workbench did not write, weights from outside the checkpoint folder. Each is refused with one line."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, fca, refused_before_anything, tiny_model

from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import read_documents
from fca_workbench.foundation.checkpoint import TRAIN_STATE_FILE
from fca_workbench.foundation.errors import UserError
from fca_workbench.training.train import TrainSettings, train
from fca_workbench.training.train_state import CHECKPOINT_FILES


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:20_000], encoding="utf-8")
    return str(path)


def tiny_run(small_text, arch="featuregate", **overrides):
    settings = dict(
        arch=arch,
        train_data=small_text,
        layers=2,
        width=32,
        heads=4,
        window=32,
        steps=4,
        batch_size=2,
        warmup=1,
        save_every=2,
        eval_windows=2,
    )
    return TrainSettings(**{**settings, **overrides})


# ----------------------------------------------------------------------------------------------------------
# 1. no code from a planted trainer_state.pt


class PlantedCode:
    """Unpickling this calls ``open(marker, "w")``: it creates the marker file, the proof code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_planted_pickle_in_the_run_folder_never_runs(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "code-ran"
    run.mkdir()
    torch.save({"settings": PlantedCode(marker), "step": 0}, run / TRAIN_STATE_FILE)
    result = fca("train", "--arch", "dense", "--out", run)
    assert not marker.exists()
    assert result.returncode == 2
    assert_one_line_error(result, "trainer_state.pt is not a training state fca train wrote")


def test_genuine_state_still_resumes_through_the_safe_unpickler(small_text, tmp_path):
    settings = tiny_run(small_text)
    assert train(settings, tmp_path / "run", stop_after=2) is None
    state = torch.load(tmp_path / "run" / TRAIN_STATE_FILE, weights_only=True)
    assert state["step"] == 2
    assert train(settings, tmp_path / "run") is not None
    assert not (tmp_path / "run" / TRAIN_STATE_FILE).exists()


# ----------------------------------------------------------------------------------------------------------
# 6. fca train: output folders


def test_train_never_replaces_a_users_readme(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "README.md").write_text("my notes")
    result = fca("train", "--arch", "dense", "--out", run)
    assert_one_line_error(result, "README.md", "did not write")
    assert (run / "README.md").read_text() == "my notes"
    assert sorted(os.listdir(run)) == ["README.md"]  # refused before training: nothing written


def test_train_out_file_is_one_line(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    assert_one_line_error(fca("train", "--arch", "dense", "--out", path), "is a file, not a folder")
    assert path.read_text() == "x"


def test_train_out_dot_trains_into_the_current_folder(small_text, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("kept")  # a file the checkpoint does not need: left alone
    monkeypatch.chdir(run)
    card = train(tiny_run(small_text, steps=2), ".")
    assert card["params"] > 0
    assert (run / "notes.txt").read_text() == "kept"
    assert set(os.listdir(run)) - {"notes.txt"} <= set(CHECKPOINT_FILES)
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(run))


@pytest.mark.parametrize("arch", ["dense", "muddpythia"])
def test_checkpoint_files_names_everything_a_finished_run_writes(arch, small_text, tmp_path):
    train(tiny_run(small_text, arch=arch, steps=2), tmp_path / "run")
    assert set(os.listdir(tmp_path / "run")) <= set(CHECKPOINT_FILES)


# ----------------------------------------------------------------------------------------------------------
# 2. coefficient cache integrity


def cache_windows(vocab_size=64, count=10, window=16, seed=1):
    return torch.randint(0, vocab_size, (count, window), generator=torch.Generator().manual_seed(seed))


def live_nll(model, windows):
    from fca_workbench.models import next_token_nll

    with torch.no_grad():
        return next_token_nll(model(windows).logits, windows).contiguous()  # a view of [B, T] rows: packed to save


def read_everything(cache):
    """Every stored tensor of every shard, as an audit reads them."""
    indices = torch.arange(cache.num_windows)
    return cache.coefficients(indices), cache.nll(indices)


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def damage_header(path):
    data = bytearray(path.read_bytes())
    data[8:24] = b"}{ not json at all"[:16]
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped bytes": (flip_last_byte, "is damaged: its sha256 differs"),
    "damaged header": (damage_header, "is damaged: its sha256 differs"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-7]), "bytes, manifest.json says"),
    "deleted": (lambda p: p.unlink(), "is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_shard_of_a_finished_cache_stops_with_one_line_naming_it(damage, tmp_path):
    from fca_workbench.audit.capture import capture

    model, windows = tiny_model("featuregate"), cache_windows()
    capture(model, windows, tmp_path / "cache", batch_size=4)
    harm, message = DAMAGE[damage]
    harm(tmp_path / "cache" / "shard_00001.safetensors")
    with pytest.raises(UserError, match="shard_00001.safetensors") as error:
        read_everything(capture(model, windows, tmp_path / "cache", batch_size=4))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_shard_damaged_after_the_cache_was_opened_is_one_line_on_read(tmp_path):
    from fca_workbench.audit.capture import capture

    model, windows = tiny_model("featuregate"), cache_windows()
    cache = capture(model, windows, tmp_path / "cache", batch_size=4)
    damage_header(tmp_path / "cache" / "shard_00002.safetensors")
    with pytest.raises(UserError, match="shard_00002.safetensors is unreadable"):
        cache.nll(torch.arange(8, 10))


def test_damaged_shard_is_one_line_from_the_cli(tiny_checkpoints, tmp_path):
    from fca_workbench.audit.capture import capture
    from fca_workbench.audit.run import AUDIT_COMMAND
    from fca_workbench.audit.session import ReplaySession
    from fca_workbench.audit.settings import AuditSettings
    from fca_workbench.results.outputs import mark_output

    settings = AuditSettings(checkpoint=str(tiny_checkpoints["featuregate"]), window=64, max_windows=4)
    session = ReplaySession.open(settings)
    model, windows = session.model, session.windows("eval")
    (tmp_path / "out").mkdir()
    mark_output(tmp_path / "out", AUDIT_COMMAND)  # an audit folder, as an earlier audit left it
    capture(model, windows, tmp_path / "out" / "cache" / "eval", batch_size=2)  # where fca audit --out looks
    damage_header(tmp_path / "out" / "cache" / "eval" / "shard_00001.safetensors")
    result = fca(
        "audit",
        tiny_checkpoints["featuregate"],
        "--window",
        64,
        "--max-windows",
        4,
        "--batch-size",
        2,
        "--out",
        tmp_path / "out",
    )
    assert result.returncode == 2
    assert_one_line_error(result, "eval/shard_00001.safetensors is damaged")


def test_corrupt_manifest_is_one_line(tmp_path):
    from fca_workbench.audit.capture import CACHE_FORMAT, capture

    model, windows = tiny_model("featuregate"), cache_windows()
    capture(model, windows, tmp_path / "cache", batch_size=4)
    (tmp_path / "cache" / "manifest.json").write_text(f'{{"format": "{CACHE_FORMAT}", "windows": ')
    with pytest.raises(UserError, match="manifest.json is not valid JSON"):
        capture(model, windows, tmp_path / "cache", batch_size=4)
    (tmp_path / "cache" / "manifest.json").write_text(json.dumps({"format": CACHE_FORMAT}))
    with pytest.raises(UserError, match="manifest.json is malformed"):
        capture(model, windows, tmp_path / "cache", batch_size=4)


def test_stale_shards_of_another_model_are_never_adopted(tmp_path):
    """The issue's case: shards left without a manifest, then a capture of another model in that folder."""
    from fca_workbench.audit.capture import capture
    from fca_workbench.audit.replay import replay_nll

    first, second, windows = tiny_model("featuregate", seed=0), tiny_model("featuregate", seed=5), cache_windows()
    capture(first, windows, tmp_path / "cache", batch_size=4)
    (tmp_path / "cache" / "manifest.json").unlink()
    (tmp_path / "cache" / "shard_00009.safetensors").write_bytes(b"a shard of some older, larger capture")
    cache = capture(second, windows, tmp_path / "cache", batch_size=4)
    own = live_nll(second, windows)
    assert not torch.allclose(own, live_nll(first, windows))  # the two models really differ
    assert torch.allclose(cache.nll(torch.arange(len(windows))), own, atol=1e-6)
    assert torch.allclose(replay_nll(second, windows, cache, "correct"), own, atol=1e-5)
    assert not (tmp_path / "cache" / "shard_00009.safetensors").exists()


def test_interrupted_capture_recaptures_a_damaged_or_unclaimed_shard(tmp_path, monkeypatch):
    import fca_workbench.audit.capture as capture_module

    model, windows = tiny_model("featuregate"), cache_windows()
    real_write = capture_module.write_shard

    def crash_at_third(tensors, path, binding):
        if path.name == "shard_00002.safetensors":
            real_write(tensors, path, binding)  # on disk, but the crash comes before the manifest claims it
            raise KeyboardInterrupt
        return real_write(tensors, path, binding)

    monkeypatch.setattr(capture_module, "write_shard", crash_at_third)
    with pytest.raises(KeyboardInterrupt):
        capture_module.capture(model, windows, tmp_path / "cache", batch_size=4)
    monkeypatch.setattr(capture_module, "write_shard", real_write)
    flip_last_byte(tmp_path / "cache" / "shard_00000.safetensors")  # claimed, then damaged
    other = tiny_model("featuregate", seed=5)
    from safetensors.torch import save_file

    with torch.no_grad():
        stale = other(windows[8:10], return_coefficients=True)
    save_file(
        {f"layer_{i}": c.contiguous() for i, c in enumerate(stale.coefficients)}
        | {"nll": live_nll(other, windows[8:10])},
        tmp_path / "cache" / "shard_00002.safetensors",
    )
    cache = capture_module.capture(model, windows, tmp_path / "cache", batch_size=4)
    assert torch.allclose(cache.nll(torch.arange(len(windows))), live_nll(model, windows), atol=1e-6)
    with torch.no_grad():
        live = model(windows, return_coefficients=True).coefficients
    assert all(torch.allclose(c, l, atol=1e-6) for c, l in zip(cache.coefficients(torch.arange(10)), live))


# ----------------------------------------------------------------------------------------------------------
# 7. weights only from inside the checkpoint folder


def official_with_shard_moved(tmp_path, weights, place):
    """A two-shard official folder whose index names its second shard where ``place`` puts it."""
    from test_official_layout import tiny_official_model, write_official

    folder = tmp_path / "ckpt"
    write_official(tiny_official_model(), folder, weights=weights, shards=2)
    suffix = "safetensors" if weights == "safetensors" else "bin"
    stem = "model" if weights == "safetensors" else "pytorch_model"
    shard = folder / f"{stem}-00002-of-00002.{suffix}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / shard.name
    shard.replace(moved)
    index_path = folder / f"{stem}.{suffix}.index.json"
    index = json.loads(index_path.read_text())
    name = place(folder, moved)
    index["weight_map"] = {k: (name if v == shard.name else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    return folder


PLACES = {
    "relative ..": lambda folder, moved: f"../elsewhere/{moved.name}",
    "absolute": lambda folder, moved: str(moved),
    "symlink": lambda folder, moved: (folder / "link.bin").symlink_to(moved) or "link.bin",
}


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
@pytest.mark.parametrize("place", sorted(PLACES))
def test_index_naming_weights_outside_the_folder_is_refused(weights, place, tmp_path):
    from fca_workbench.models import load_model

    folder = official_with_shard_moved(tmp_path, weights, PLACES[place])
    with pytest.raises(UserError, match="points outside the folder") as error:
        load_model(folder)
    assert "\n" not in str(error.value)


def test_single_weight_file_symlinked_from_elsewhere_is_refused(tmp_path):
    from test_official_layout import tiny_official_model, write_official

    from fca_workbench.models import load_model

    folder = tmp_path / "ckpt"
    write_official(tiny_official_model(), folder)
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "model.safetensors")
    with pytest.raises(UserError, match="model.safetensors in .* points outside"):
        load_model(folder)


def test_hub_cache_snapshot_with_blob_symlinks_still_loads(tmp_path):
    """``huggingface_hub`` stores ``snapshots/<rev>/<file>`` as symlinks to ``../../blobs/<hash>``."""
    from conftest import assert_identical_models
    from test_official_layout import tiny_official_model, tokens, write_official

    from fca_workbench.models import load_model

    model, plain = tiny_official_model(), tmp_path / "plain"
    write_official(model, plain, shards=2)
    snapshot, blobs = tmp_path / "models--x" / "snapshots" / "abc123", tmp_path / "models--x" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for n, path in enumerate(sorted(plain.iterdir())):
        (blobs / f"blob{n}").write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{n}")
    assert_identical_models(model, load_model(snapshot), tokens())


# ----------------------------------------------------------------------------------------------------------
# 3. absurd configs refused from the config, before anything is built


def checkpoint_with(tiny_checkpoints, tmp_path, arch, **fields):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for item in tiny_checkpoints[arch].iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.mark.parametrize(
    "arch, field, value",
    [
        ("featuregate", "n_layer", 10**6),
        ("dense", "n_embd", 10**7),
        ("dense", "vocab_size", 10**9),
        ("muddpythia", "block_size", 10**9),
        ("muddpythia", "intermediate_size", 10**8),
        ("dense", "n_layer", 0),
    ],
)
def test_absurd_sizes_are_refused_before_building_naming_the_field(
    tiny_checkpoints, tmp_path, arch, field, value, nothing_built
):
    from fca_workbench.models import load_model

    folder = checkpoint_with(tiny_checkpoints, tmp_path, arch, **{field: value})
    with pytest.raises(UserError, match=f"{field}={value} is out of range") as error:
        load_model(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_hidden_layers", 10**9),
        ("hidden_size", 10**7),
        ("num_local_experts", 10**8),
        ("max_position_embeddings", 10**12),
        ("num_attention_heads", 0),
    ],
)
def test_absurd_sizes_of_a_foreign_model_are_refused_before_building(
    tiny_mixtral, tmp_path, field, value, nothing_built
):
    """A planted transformers config.json (here a Mixtral's) is checked before transformers builds anything."""
    from fca_workbench.adapters.controlled import load_controlled

    folder = tmp_path / "planted"
    folder.mkdir()
    for item in tiny_mixtral.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(UserError, match=f"config.json: {field}={value} is out of range") as error:
        load_controlled(folder)
    assert "\n" not in str(error.value)


def test_foreign_model_beyond_available_memory_is_refused(tiny_mixtral, monkeypatch):
    import fca_workbench.models.limits as limits
    from fca_workbench.adapters.controlled import load_controlled

    model = load_controlled(tiny_mixtral).model  # fits: loads
    needed = sum(p.numel() for p in model.parameters()) * 4
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: type("Memory", (), {"available": needed // 2})())
    with pytest.raises(
        UserError, match=f"{sum(p.numel() for p in model.parameters()):,} parameters and 0.0 GiB of buffers, 0.0 GiB"
    ):
        load_controlled(tiny_mixtral)


def test_buffers_count_with_parameters_before_loading(tmp_path, monkeypatch):
    """gpt_neo keeps a causal mask of the context squared per layer (a buffer, not persistent, in no weight
    file): at 8,192 positions 64 MiB a layer against 4 MiB of weights. The check before loading counts it."""
    import transformers
    from zoo import build_any, save

    import fca_workbench.models.limits as limits
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.data.tokenizer import load_tokenizer

    folder = save(build_any("gpt_neo"), tmp_path / "gpt_neo", load_tokenizer())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    built = transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(**{**config, "max_position_embeddings": 8192}))
    parameters = sum(p.numel() for p in built.parameters())
    masks = 2 * 8192**2  # bool, one a layer
    assert parameters * 4 < 16 << 20 < masks  # the weights alone would fit
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: type("Memory", (), {"available": 64 << 20})())
    with pytest.raises(UserError, match=f"{parameters:,} parameters and 0.1 GiB of buffers, 0.1 GiB in float32, more"):
        load_controlled(folder)


def test_train_refuses_absurd_sizes_of_an_hf_config_before_building(tmp_path):
    (tmp_path / "moe.json").write_text(json.dumps({"model_type": "mixtral", "num_hidden_layers": 10**9}))
    result = fca(
        "train", "--hf-config", tmp_path / "moe.json", "--train", tmp_path / "missing.txt", "--out", tmp_path / "run"
    )
    assert_one_line_error(result, "fca train's --hf-config: num_hidden_layers=1000000000 is out of range")
    assert not (tmp_path / "run").exists()


def test_parameters_beyond_available_memory_are_refused(tiny_checkpoints, monkeypatch):
    import fca_workbench.models.limits as limits
    from fca_workbench.models import load_model

    model = load_model(tiny_checkpoints["featuregate"])  # fits: loads
    needed = sum(p.numel() for p in model.parameters()) * 4
    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: type("Memory", (), {"available": needed // 2})())
    with pytest.raises(UserError, match="parameters and 0.0 GiB of buffers, 0.0 GiB in float32, more than the 0.0 GiB"):
        load_model(tiny_checkpoints["featuregate"])


def test_train_refuses_absurd_sizes_before_reading_any_text(tmp_path):
    text = tmp_path / "missing.txt"  # never read: the sizes are refused first
    result = fca("train", "--arch", "muddpythia", "--layers", 10**6, "--train", text, "--out", tmp_path / "run")
    assert_one_line_error(result, "n_layer=1000000 is out of range")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(width=97), "n_embd=97 is not divisible by n_head=4"),
        (dict(layers=200, width=65536, heads=512), "GiB for fp32 weights, gradients and AdamW, more than the"),
    ],
)
def test_train_refuses_sizes_it_cannot_build(sizes, message):
    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.training.train import build_model

    with pytest.raises(UserError, match=message):
        build_model(TrainSettings(arch="dense", **sizes), load_tokenizer())


@pytest.mark.parametrize("name", ["featuregate-s0", "dense-s0", "muddpythia-s0"])
def test_shipped_checkpoints_still_load(name):
    from fca_workbench.data.corpus import DATA_DIR
    from fca_workbench.models import load_model

    model = load_model(DATA_DIR / "checkpoints" / name)
    assert sum(p.numel() for p in model.parameters()) > 0


# ----------------------------------------------------------------------------------------------------------
# 6. output folders: audit, audit-many, reproduce


def test_audit_refuses_to_replace_an_audit_json_it_did_not_write(tiny_checkpoints, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "audit.json").write_text(json.dumps({"schema": "fca-audit/1", "mine": "hand-written notes"}))
    result = fca("audit", tiny_checkpoints["dense"], "--out", out)
    assert_one_line_error(result, "audit.json exists and is not a fca-audit/1 file this workbench wrote")
    assert json.loads((out / "audit.json").read_text())["mine"] == "hand-written notes"
    assert sorted(os.listdir(out)) == ["audit.json"]  # refused before any work: no cache, no outputs


def test_out_naming_a_file_is_one_line(tiny_checkpoints, tmp_path):
    from fca_workbench.audit.many import aggregate_audits
    from fca_workbench.audit.run import AuditSettings
    from fca_workbench.notebooks import reproduce

    path = tmp_path / "file"
    path.write_text("x")
    assert_one_line_error(fca("audit", tiny_checkpoints["dense"], "--out", path), "is a file, not a folder")
    with pytest.raises(UserError, match="is a file, not a folder"):
        aggregate_audits([AuditSettings(checkpoint=str(tiny_checkpoints["dense"]))], path)
    with pytest.raises(UserError, match="is a file, not a folder"):
        reproduce.plan({"notebooks": ["03_static_profiles"]}, path)
    assert path.read_text() == "x"


def test_a_file_where_a_folder_belongs_is_one_line_before_anything_is_claimed(tiny_checkpoints, tmp_path, capsys):
    """A coefficient cache's split folder, the cache or an output folder's parent that is a file: today a
    ``FileExistsError`` / ``NotADirectoryError`` traceback halfway through, after ``--out`` was claimed."""
    folder, afile, cache = tiny_checkpoints["featuregate"], tmp_path / "afile", tmp_path / "cache"
    afile.write_text("x")
    for split in ("eval", "calibration"):
        cache.mkdir(exist_ok=True)
        (cache / split).write_text("x")
        argv = ["audit", folder, "--cache", cache, "--max-windows", 2]
        refused_before_anything(argv, tmp_path / "out", capsys, f"{cache / split} is a file, not a folder")
        (cache / split).unlink()
    argv = ["audit", folder, "--cache", afile / "cache"]
    refused_before_anything(argv, tmp_path / "out", capsys, f"{afile} is a file, not a folder")
    refused_before_anything(["audit", folder, "--cache", afile], tmp_path / "out", capsys, "is a file, not a folder")
    for command in (["audit", folder], ["audit-many", folder], ["train", "--arch", "dense", "--steps", 1]):
        refused_before_anything(command, afile / "sub", capsys, f"--out {afile / 'sub'}: {afile} is a file")
    assert afile.read_text() == "x" and sorted(os.listdir(cache)) == []


def test_a_folder_where_a_file_belongs_is_one_line_before_anything_is_claimed(tiny_checkpoints, tmp_path, capsys):
    folder, place = tiny_checkpoints["featuregate"], tmp_path / "a-folder.json"
    place.mkdir()
    for flags in (["--eval", place], ["--calib", place], ["--device-map", place]):
        refused_before_anything(["audit", folder, *flags], tmp_path / "out", capsys, f"{place} is a folder, not a")
    for flags in (["--hf-config", place], ["--arch", "dense", "--train", place]):
        refused_before_anything(["train", *flags], tmp_path / "out", capsys, f"{place} is a folder, not a")


def test_audit_many_names_two_checkpoints_with_one_folder_name_apart(tiny_checkpoints, tmp_path):
    from fca_workbench.audit.many import aggregate_audits, audit_names
    from fca_workbench.audit.run import AuditSettings

    assert audit_names(["x/a/fg", "x/b/fg", "x/c/other"]) == ["a-fg", "b-fg", "other"]
    assert audit_names(["p/a/fg", "q/a/fg"]) == ["1-a-fg", "2-a-fg"]
    with pytest.raises(UserError, match="is given twice"):
        audit_names(["x/a/fg", "x/a/../a/fg"])  # x/a/fg: a path, not a hub name ORG/NAME
    folders = []
    for parent in ("a", "b"):
        folder = tmp_path / parent / "fg"
        folder.mkdir(parents=True)
        for item in tiny_checkpoints["dense"].iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        folders.append(folder)
    options = dict(window=64, max_windows=2, batch_size=2, latency_repeats=1, resamples=10)
    summary = aggregate_audits([AuditSettings(checkpoint=str(f), **options) for f in folders], tmp_path / "many")
    assert summary["audits"] == ["a-fg", "b-fg"]
    paths = [json.loads((tmp_path / "many" / n / "audit.json").read_text())["model"]["path"] for n in ("a-fg", "b-fg")]
    assert paths == [str(f.resolve()) for f in folders]


def test_audit_many_checks_every_output_folder_before_the_first_audit(tiny_checkpoints, tmp_path):
    from fca_workbench.audit.many import aggregate_audits
    from fca_workbench.audit.run import AuditSettings

    (tmp_path / "many" / "featuregate").mkdir(parents=True)
    (tmp_path / "many" / "featuregate" / "audit.json").write_text("my own audit notes")
    settings = [AuditSettings(checkpoint=str(tiny_checkpoints[a])) for a in ("dense", "featuregate")]
    with pytest.raises(UserError, match="featuregate/audit.json exists and is not"):
        aggregate_audits(settings, tmp_path / "many")
    assert not (tmp_path / "many" / "dense").exists()


def test_cache_errors_suggest_no_option_a_command_lacks():
    from fca_workbench.audit.capture import capture

    windows = cache_windows()
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"fca-hardening-{os.getpid()}"
    try:
        capture(tiny_model("featuregate", seed=0), windows, folder, batch_size=4)
        with pytest.raises(UserError) as error:
            capture(tiny_model("featuregate", seed=5), windows, folder, batch_size=4)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    assert "another model" in str(error.value) and "--" not in str(error.value)


def test_reproduce_overwrites_only_a_folder_it_wrote(tiny_checkpoints, tmp_path):
    from fca_workbench.notebooks import reproduce
    from fca_workbench.results.outputs import RESULTS_MARKER, mark_results

    out = tmp_path / "mine"
    (out / "notebooks").mkdir(parents=True)
    (out / "README.md").write_text("my README")
    config = {"notebooks": ["03_static_profiles"], "parameters": {"checkpoints": [str(tiny_checkpoints["dense"])]}}
    for overwrite in (False, True):
        with pytest.raises(UserError, match=f"was not written by fca reproduce \\(no {RESULTS_MARKER}"):
            reproduce.plan(config, out, overwrite=overwrite)
    assert (out / "README.md").read_text() == "my README"
    mark_results(out)
    assert reproduce.plan(config, out, overwrite=True).out == out.resolve()


# ----------------------------------------------------------------------------------------------------------
# issue 23, 4. every file reader bounded, every error one line

DEEP_JSON = "[" * 100_000


def damaged_copy(folder, tmp_path, name, payload):
    """A copy of checkpoint ``folder`` whose file ``name`` holds ``payload``."""
    import shutil

    copy = shutil.copytree(folder, tmp_path / f"copy-{Path(name).stem}")
    (copy / name).write_text(payload) if isinstance(payload, str) else (copy / name).write_bytes(payload)
    return copy


def test_deeply_nested_json_is_one_line_in_every_cli_reader(tiny_checkpoints, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_JSON)
    checkpoint = damaged_copy(tiny_checkpoints["featuregate"], tmp_path, "config.json", DEEP_JSON)
    assert_one_line_error(fca("audit", checkpoint, "--out", tmp_path / "a"), "config.json is nested too deeply")
    assert_one_line_error(fca("train", "--hf-config", deep, "--out", tmp_path / "t"), "deep.json is nested too deeply")
    assert_one_line_error(fca("reproduce", "--config", deep, "--out", tmp_path / "r"), "deep.json is nested too deeply")
    assert_one_line_error(fca("dashboard", "--registry", deep), "deep.json is nested too deeply")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "audit.json").write_text(DEEP_JSON)  # --out holding a deep audit.json
    result = fca("audit", tiny_checkpoints["featuregate"], "--out", tmp_path / "a")
    assert_one_line_error(result, "audit.json exists and is not a fca-audit/1 file")
    eval_text = tmp_path / "eval.jsonl"
    eval_text.write_text('{"text": "fine"}\n' + DEEP_JSON + "\n")
    result = fca("audit", tiny_checkpoints["featuregate"], "--eval", eval_text, "--out", tmp_path / "e")
    assert_one_line_error(result, "eval.jsonl line 2 is nested too deeply")


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ("[]", "unreadable tokenizer in"),
        ('{"model": 5}', "unreadable tokenizer in"),
        ('{"version": "1.0", "model": {"type": "NoSuchModel"}, "added_tokens": []}', "unreadable tokenizer in"),
        (DEEP_JSON, "unreadable tokenizer in"),
    ],
)
def test_malformed_tokenizer_json_is_one_line(payload, fragment, tiny_checkpoints, tmp_path):
    checkpoint = damaged_copy(tiny_checkpoints["featuregate"], tmp_path, "tokenizer.json", payload)
    assert_one_line_error(fca("audit", checkpoint, "--out", tmp_path / "out"), fragment)


def safetensors_with_header(path, header):
    import struct

    encoded = json.dumps(header).encode()
    payload = path.read_bytes()
    (length,) = struct.unpack("<Q", payload[:8])
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + payload[8 + length :])


@pytest.mark.parametrize("claim", ["shape", "offsets", "header length"])
def test_foreign_safetensors_header_claiming_absurd_sizes_is_one_line(claim, tiny_mixtral, tmp_path):
    import shutil
    import struct

    folder = shutil.copytree(tiny_mixtral, tmp_path / "mixtral")
    weights = folder / "model.safetensors"
    if claim == "header length":
        weights.write_bytes(struct.pack("<Q", 1 << 62) + weights.read_bytes()[8:])
        fragment = "header too large"
    else:
        from fca_workbench.foundation.files import safetensors_shapes

        payload = weights.read_bytes()
        (length,) = struct.unpack("<Q", payload[:8])
        header = json.loads(payload[8 : 8 + length])
        name = sorted(k for k in header if k != "__metadata__")[0]
        header[name] = dict(header[name], **({"shape": [10**12, 10**6]} if claim == "shape" else {}))
        if claim == "offsets":
            header[name]["data_offsets"] = [0, 10**15]
        safetensors_with_header(weights, header)
        fragment = "overflow computing buffer size" if claim == "shape" else "invalid shape, data type, or offset"
        with pytest.raises(UserError, match=fragment):
            safetensors_shapes(weights)
    assert_one_line_error(fca("audit", folder, "--out", tmp_path / "out"), "model.safetensors", fragment)


def test_manifest_as_a_folder_or_nested_deep_is_one_line(tiny_checkpoints, tmp_path):
    manifest = tmp_path / "cache" / "eval" / "manifest.json"  # a cache of its own: --out holds only audits
    manifest.mkdir(parents=True)
    args = ("audit", tiny_checkpoints["featuregate"], "--window", 32, "--max-windows", 2, "--out", tmp_path / "out")
    args += ("--cache", tmp_path / "cache")
    assert_one_line_error(fca(*args), "manifest.json is a folder", "delete")
    manifest.rmdir()
    manifest.write_text(DEEP_JSON)
    assert_one_line_error(fca(*args), "manifest.json is nested too deeply", "delete")


def test_unknown_home_in_fca_checkpoints_is_one_line(monkeypatch):
    from fca_workbench.foundation.resources import checkpoints_dir

    monkeypatch.setenv("FCA_CHECKPOINTS", "~nosuchuser-fca/x")
    with pytest.raises(UserError, match="FCA_CHECKPOINTS=~nosuchuser-fca/x names a home folder that does not exist"):
        checkpoints_dir()


@pytest.fixture
def interrupted_run(small_text, tmp_path):
    """A run stopped after 2 of 4 steps: its settings and folder, to be damaged and resumed."""
    settings = tiny_run(small_text, arch="dense")
    assert train(settings, tmp_path / "run", stop_after=2) is None
    return settings, tmp_path / "run"


def resaved(run, change):
    state = torch.load(run / TRAIN_STATE_FILE, weights_only=True)
    change(state)
    torch.save(state, run / TRAIN_STATE_FILE)


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (lambda s: s.update(step="two"), "holds step 'two'"),
        (lambda s: s.update(step=2.5), "holds step '2.5'"),
        (lambda s: s.update(step=10**6), "holds step '1000000', not one of 0..4"),
        (lambda s: s["model"].update({k: torch.zeros(3, 3) for k in list(s["model"])[:1]}), "size mismatch"),
        (
            lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(7)),
            "optimizer state exp_avg has shape [7]",
        ),
        (lambda s: s["scheduler"].update(last_epoch="x"), "the scheduler is at step x"),
        (lambda s: s["settings"].update(lr=torch.zeros(2)), "is not a training state fca train wrote"),
    ],
)
def test_resuming_a_damaged_trainer_state_is_one_line(damage, fragment, interrupted_run):
    settings, run = interrupted_run
    resaved(run, damage)
    with pytest.raises(UserError, match=re.escape(fragment)) as error:
        train(settings, run)
    assert "\n" not in str(error.value) and "remove it or choose another --out" in str(error.value)


@pytest.mark.parametrize(
    "log",
    [
        b"\x00\xff garbage",
        b"step,loss\n1,2\n",
        b"step,loss,lr,tokens_seen,seconds\n1,x,1,1,1\n",
        b"step,loss,lr,tokens_seen,seconds\n1,2,3\n",
        b"step,loss,lr,tokens_seen,seconds\n1,2,3,4,5,6\n",
        b'step,loss,lr,tokens_seen,seconds\n"1,2,3,4,5\n',
    ],
)
def test_resuming_with_a_garbage_train_log_is_one_line(log, interrupted_run):
    settings, run = interrupted_run
    (run / "train_log.csv").write_bytes(log)
    with pytest.raises(UserError, match="train_log.csv is not a log fca train wrote") as error:
        train(settings, run)
    assert "\n" not in str(error.value)


def test_a_damaged_resume_is_one_line_from_the_cli(small_text, tmp_path):
    run = tmp_path / "run"
    flags = ("--train", small_text, "--layers", 1, "--width", 16, "--heads", 2, "--window", 16, "--steps", 4)
    command = ("train", "--arch", "dense", *flags, "--batch-size", 2, "--save-every", 2, "--out", run)
    assert fca(*command, "--stop-after", 2).returncode == 0
    resaved(run, lambda state: state.update(step="two"))
    assert_one_line_error(fca(*command), "holds step 'two'", "remove it or choose another --out")


@pytest.mark.parametrize("log", [b"\x00\xff garbage", b"step,audit_seconds\nx,1\n", b"step,audit_seconds\n1,2,3\n"])
def test_resuming_with_a_garbage_audit_log_is_one_line(log, small_text, tmp_path):
    settings = tiny_run(small_text, audit_every=2, audit_windows=2)
    assert train(settings, tmp_path / "run", stop_after=2) is None
    (tmp_path / "run" / "audit_log.csv").write_bytes(log)
    with pytest.raises(UserError, match="audit_log.csv is not a log fca train wrote") as error:
        train(settings, tmp_path / "run")
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------------------------------------
# a forged cache: re-sealed consistently (hash in the manifest, binding in the shard), values out of range

FORGED_INDICES = {
    "an expert past the count": lambda index: torch.full_like(index, 200),
    "2**40 as int64": lambda index: torch.full_like(index, 2**40, dtype=torch.int64),
    "-1 as int16": lambda index: torch.full_like(index, -1, dtype=torch.int16),
    "a float": lambda index: index.float(),
    "another shape": lambda index: index[..., :1].repeat(1, 1, 3)[:, :-1],
}


def resealed(folder: Path, key: str, change) -> None:
    """Shard 0 of the cache in ``folder`` with ``key`` changed, written as capture writes a shard (its binding
    in its metadata) and claimed in the manifest with its true hash and size: only the values are forged."""
    from safetensors.torch import load_file

    from fca_workbench.audit.capture import shard_binding, write_shard

    manifest = json.loads((folder / "manifest.json").read_text())
    path = folder / "shard_00000.safetensors"
    tensors = load_file(path)
    tensors[key] = change(tensors[key]).contiguous()
    manifest["shards"][path.name] = write_shard(tensors, path, shard_binding(manifest, 0))
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("forgery", sorted(FORGED_INDICES))
def test_a_forged_router_index_is_one_line_in_the_sweep(forgery, tiny_mixtral, tmp_path):
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.audit.capture import capture
    from fca_workbench.audit.sweep import per_layer_sweep

    model, windows = (
        load_controlled(tiny_mixtral),
        torch.randint(0, 4096, (4, 16), generator=torch.Generator().manual_seed(0)),
    )
    capture(model, windows, tmp_path / "cache", batch_size=2)
    resealed(tmp_path / "cache", "layer_0.top_k_index", FORGED_INDICES[forgery])
    cache = capture(model, windows, tmp_path / "cache", batch_size=2)  # verified: hashes and bindings hold
    with pytest.raises(UserError, match="shard_00000.safetensors holds layer_0.top_k_index") as error:
        per_layer_sweep(model, windows, cache, ["correct"], None, 0, torch.ones(1, len(windows)))
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def moe_audit(tmp_path_factory):
    """A finished audit of the shipped MoE checkpoint (top-2 of 8 experts) on 2 windows."""
    from fca_workbench.cli import main
    from fca_workbench.data.corpus import DATA_DIR

    out = tmp_path_factory.mktemp("moe") / "audit"
    argv = ["audit", str(DATA_DIR / "checkpoints" / "moe-s0"), "--max-windows", "2", "--batch-size", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    return argv, out


@pytest.mark.parametrize(
    "key, forgery",
    [("layer_0.top_k_index", "an expert past the count"), ("layer_1.top_k_index", "-1 as int16"), ("nll", "a float")],
)
def test_a_forged_cache_is_one_line_in_the_audit(moe_audit, key, forgery, tmp_path, capsys):
    import shutil

    from fca_workbench.cli import main

    argv, audit = moe_audit
    out = Path(shutil.copytree(audit, tmp_path / "audit"))
    change = FORGED_INDICES[forgery] if key != "nll" else (lambda nll: nll.double())
    resealed(out / "cache" / "eval", key, change)
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fca: error: ") and f"holds {key}" in lines[0], lines
