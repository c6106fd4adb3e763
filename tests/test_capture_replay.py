"""Capture and frozen replay on a tiny model, each against a direct computation: the cache holds exactly the
model's coefficients and NLL; an interrupted capture never leaves a partial shard and resumes without touching
the shards already written; every replay condition equals a hand-built frozen forward."""

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from conftest import tiny_model
from safetensors import safe_open

from fca_workbench.audit.assignment import ConditionCoefficients
from fca_workbench.audit.capture import capture, model_fingerprint
from fca_workbench.audit.interventions import derangement, position_permutations
from fca_workbench.audit.replay import replay_nll
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.results.conditions import STATIC_PROFILES

SHARD = 2  # 6 windows -> 3 shards


def reference_nll(logits, ids):
    """Per-token next-token cross-entropy, computed here rather than by the workbench."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), ids[:, 1:], reduction="none")


def count_forwards(model, monkeypatch, crash_at=None):
    """Count the model's forwards (its first block runs once in each, however the forward is driven); with
    ``crash_at``, that forward is killed (before anything is written). ``monkeypatch.undo()`` stops counting."""
    calls, first = [], model.blocks[0]
    real = first.forward

    def forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == crash_at:
            raise KeyboardInterrupt("killed mid-capture")
        return real(*args, **kwargs)

    monkeypatch.setattr(first, "forward", forward)
    return calls


def shard_files(folder):
    return sorted(folder.glob("shard_*.safetensors"))


def identity(path):
    """What rewriting a file would change, even with identical bytes: inode and modification time."""
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns, path.read_bytes()


@pytest.fixture
def model():
    return tiny_model("featuregate")


def test_cache_holds_the_models_own_coefficients_and_nll(model, windows, tmp_path):
    cache = capture(model, windows, tmp_path / "cache", batch_size=4)  # shards of 4 and 2 windows
    with torch.no_grad():
        out = model(windows, return_coefficients=True)
    order = torch.tensor([5, 0, 3, 4])  # across both shards, out of order
    for stored, own in zip(cache.coefficients(order), out.coefficients):
        torch.testing.assert_close(stored, own[order], rtol=0, atol=1e-6)
    torch.testing.assert_close(cache.nll(order), reference_nll(out.logits, windows)[order], rtol=0, atol=1e-5)
    assert [i.tolist() for i in cache.shard_indices()] == [[0, 1, 2, 3], [4, 5]]
    assert [b[0].shape[0] for b in cache.batches()] == [4, 2]
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["windows"] == 6 and manifest["shard_size"] == 4
    assert manifest["slot_shapes"] == [list(s) for s in model.coefficient_slot_shapes]
    assert manifest["versions"] == {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }
    for dtype in (torch.int32, torch.uint8):  # any integer index tensor selects rows (uint8 is no mask here)
        assert torch.equal(cache.nll(order.to(dtype)), cache.nll(order))
        assert all(torch.equal(a, b) for a, b in zip(cache.coefficients(order.to(dtype)), cache.coefficients(order)))


def test_a_finished_cache_is_reused_and_a_different_layout_refused(model, windows, tmp_path, monkeypatch):
    capture(model, windows, tmp_path / "cache", batch_size=SHARD)
    calls = count_forwards(model, monkeypatch)
    again = capture(model, windows, tmp_path / "cache", batch_size=SHARD)
    assert calls == [] and again.num_windows == 6
    with pytest.raises(UserError, match="shard_size=2, this run needs 3"):
        capture(model, windows, tmp_path / "cache", batch_size=3)


def test_a_fresh_capture_is_not_read_back_but_a_reused_one_is_verified(model, windows, tmp_path, monkeypatch):
    """Capture hashes each shard from the bytes it writes; reading them back (and importing jsonschema for
    its own manifest) cost 17% of a capture. A finished cache found on disk is still verified before use."""
    from fca_workbench.audit.capture import CoefficientCache

    def fail(self):
        raise AssertionError("verified")

    monkeypatch.setattr(CoefficientCache, "verify", fail)
    cache = capture(model, windows, tmp_path / "cache", batch_size=SHARD)
    with torch.no_grad():
        expected = reference_nll(model(windows).logits, windows)
    torch.testing.assert_close(cache.nll(torch.arange(6)), expected, rtol=0, atol=1e-5)
    with pytest.raises(AssertionError, match="verified"):
        capture(model, windows, tmp_path / "cache", batch_size=SHARD)


@pytest.mark.parametrize("what", ["model", "data"])
def test_a_cache_of_another_model_or_data_is_refused_naming_the_fingerprints(model, windows, tmp_path, what):
    capture(model, windows, tmp_path / "cache", batch_size=SHARD)
    stored = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    other_model = tiny_model("featuregate", seed=7) if what == "model" else model
    other_windows = windows.flip(0) if what == "data" else windows
    key = f"{what}_fingerprint"
    now = model_fingerprint(other_model) if what == "model" else fingerprint_tensor(other_windows)
    message = (
        f"coefficient cache {tmp_path / 'cache'} was captured from another {what} ({key} {stored[key][:12]} "
        f"!= {now[:12]}); delete that folder to capture again"
    )
    with pytest.raises(UserError) as refused:
        capture(other_model, other_windows, tmp_path / "cache", batch_size=SHARD)
    assert str(refused.value) == message


def test_resume_keeps_the_finished_shards_untouched(model, windows, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    count_forwards(model, monkeypatch, crash_at=3)
    with pytest.raises(KeyboardInterrupt):
        capture(model, windows, folder, batch_size=SHARD)
    assert json.loads((folder / "manifest.json").read_text())["complete"] is False
    finished = {p.name: identity(p) for p in shard_files(folder)}
    assert sorted(finished) == ["shard_00000.safetensors", "shard_00001.safetensors"]

    monkeypatch.undo()
    calls = count_forwards(model, monkeypatch)
    capture(model, windows, folder, batch_size=SHARD)
    assert len(calls) == 1  # only the missing shard is computed ...
    assert {name: identity(folder / name) for name in finished} == finished  # ... the others are not rewritten
    monkeypatch.undo()
    fresh = capture(model, windows, tmp_path / "fresh", batch_size=SHARD)
    assert [p.read_bytes() for p in shard_files(folder)] == [p.read_bytes() for p in shard_files(fresh.folder)]


def test_a_crash_while_writing_a_shard_leaves_no_partial_shard(model, windows, tmp_path, monkeypatch):
    folder, real_write, saved = tmp_path / "cache", Path.write_bytes, []

    def half_written_then_crash(path, payload):
        if "shard_" not in path.name:
            return real_write(path, payload)
        if len(saved) == 2:  # the third shard: half its bytes reach the disk, then the process dies
            real_write(path, payload[: len(payload) // 2])
            raise KeyboardInterrupt("killed while writing")
        saved.append(path)
        return real_write(path, payload)

    monkeypatch.setattr(Path, "write_bytes", half_written_then_crash)
    with pytest.raises(KeyboardInterrupt):
        capture(model, windows, folder, batch_size=SHARD)
    assert [p.name for p in shard_files(folder)] == ["shard_00000.safetensors", "shard_00001.safetensors"]
    for path in shard_files(folder):  # every shard under its final name is whole
        with safe_open(path, framework="pt") as handle:
            assert handle.get_tensor("nll").shape == (SHARD, windows.shape[1] - 1)

    monkeypatch.undo()
    resumed = capture(model, windows, folder, batch_size=SHARD)
    fresh = capture(model, windows, tmp_path / "fresh", batch_size=SHARD)
    everything = torch.arange(6)
    assert torch.equal(resumed.nll(everything), fresh.nll(everything))
    assert all(torch.equal(a, b) for a, b in zip(resumed.coefficients(everything), fresh.coefficients(everything)))
    assert torch.equal(
        replay_nll(model, windows, resumed, "cross_input", seed=1),
        replay_nll(model, windows, fresh, "cross_input", seed=1),
    )
    assert not list(folder.glob(".*.tmp"))


# ------------------------------------------------------------------------------------------------ replay


def frozen_nll(model, windows, coefficients):
    """The frozen forward of all windows in one batch, with the given per-layer coefficients."""
    with torch.no_grad():
        return reference_nll(model(windows, coefficients=coefficients).logits, windows)


@pytest.fixture(params=["featuregate", "muddpythia"])
def captured(request, windows, tmp_path):
    model = tiny_model(request.param)
    cache = capture(model, windows, tmp_path / "eval", batch_size=SHARD)
    with torch.no_grad():
        own = model(windows, return_coefficients=True).coefficients
    return model, cache, own


def test_correct_and_unperturbed_reproduce_the_capture(captured, windows):
    model, cache, own = captured
    correct = replay_nll(model, windows, cache, "correct")
    assert torch.equal(correct, cache.nll(torch.arange(6)))  # the same batches, the same arithmetic
    assert torch.equal(replay_nll(model, windows, cache, "unperturbed"), correct)
    torch.testing.assert_close(correct, frozen_nll(model, windows, own), rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 5])
def test_cross_input_and_token_shuffle_equal_hand_built_reassignments(captured, windows, seed):
    model, cache, own = captured
    donors = derangement(6, seed)
    cross = replay_nll(model, windows, cache, "cross_input", seed=seed)
    torch.testing.assert_close(cross, frozen_nll(model, windows, [c[donors] for c in own]), rtol=0, atol=1e-5)
    positions = position_permutations(torch.arange(6), windows.shape[1], seed)
    moved = [torch.stack([c[w, positions[w]] for w in range(6)]) for c in own]
    shuffle = replay_nll(model, windows, cache, "token_shuffle", seed=seed)
    torch.testing.assert_close(shuffle, frozen_nll(model, windows, moved), rtol=0, atol=1e-5)
    correct = replay_nll(model, windows, cache, "correct")
    assert (cross - correct).abs().max() > 1e-3 and (shuffle - correct).abs().max() > 1e-3


def test_one_layer_models_and_one_window_caches_replay(windows, tmp_path):
    model = tiny_model("featuregate", layers=1)
    cache = capture(model, windows[:1], tmp_path / "one", batch_size=SHARD)
    assert torch.equal(replay_nll(model, windows[:1], cache, "correct"), cache.nll([0]))  # no derangement needed
    profiles = {"layer_mean": [torch.full(model.coefficient_slot_shapes[0], 0.7)]}
    with torch.no_grad():
        own = model(windows[:1], return_coefficients=True).coefficients
    torch.testing.assert_close(
        replay_nll(model, windows[:1], cache, "layer_mean", profiles),
        frozen_nll(model, windows[:1], [profiles["layer_mean"][0].expand_as(own[0])]),
        rtol=0,
        atol=1e-5,
    )


def test_the_default_seed_is_zero(captured):
    _, cache, _ = captured
    assert torch.equal(ConditionCoefficients("cross_input", cache).donors, derangement(6, 0))


def test_cross_input_depends_on_the_seed(captured, windows):
    model, cache, _ = captured
    by_seed = [replay_nll(model, windows, cache, "cross_input", seed=seed) for seed in range(4)]
    assert any(not torch.equal(by_seed[0], other) for other in by_seed[1:])  # 4 equal draws of 265: ~1e-7


def test_static_profiles_and_one_layer_replays_equal_hand_built_ones(captured, windows):
    model, cache, own = captured
    profiles = {
        name: [
            torch.full(c.shape[2:], 0.5 + 0.25 * layer) if name == "layer_mean" else torch.tensor(0.9 - 0.1 * layer)
            for layer, c in enumerate(own)
        ]
        for name in STATIC_PROFILES
        if name != "layer_token_mean"
    }
    profiles["layer_position_mean"] = [c.mean(0) for c in own]
    for name, profile in profiles.items():
        expected = frozen_nll(model, windows, [p.expand_as(c) for p, c in zip(profile, own)])
        torch.testing.assert_close(replay_nll(model, windows, cache, name, profiles), expected, rtol=0, atol=1e-5)
    ids = windows.unique()
    rows = torch.linspace(0.5, 1.5, len(ids) + 1)  # a value per token id, then the one for unseen tokens
    profiles["layer_token_mean"] = [rows.view(-1, *[1] * (c.dim() - 2)).expand(-1, *c.shape[2:]) for c in own]
    profiles["token_ids"] = [ids for _ in own]
    by_token = rows[torch.searchsorted(ids, windows)]
    expected = frozen_nll(
        model, windows, [by_token.view(*windows.shape, *[1] * (c.dim() - 2)).expand_as(c) for c in own]
    )
    replayed = replay_nll(model, windows, cache, "layer_token_mean", profiles)
    torch.testing.assert_close(replayed, expected, rtol=0, atol=1e-5)
    one_layer = [profiles["layer_mean"][1].expand_as(c) if layer == 1 else c for layer, c in enumerate(own)]
    torch.testing.assert_close(
        replay_nll(model, windows, cache, "layer_mean", profiles, controllers=[1]),
        frozen_nll(model, windows, one_layer),
        rtol=0,
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="needs its static profile"):
        replay_nll(model, windows, cache, "layer_mean")
    with pytest.raises(UserError, match="unknown condition 'bogus'"):
        replay_nll(model, windows, cache, "bogus")


def test_one_checkpoint_reached_by_two_spellings_of_its_path_has_one_fingerprint(tmp_path, monkeypatch):
    """The fingerprint is of the model, not of where it was loaded from: a relative and an absolute path (or
    two nodes mounting the checkpoint differently) share caches; a changed config field still changes it."""
    from fca_workbench.adapters.controlled import load_controlled

    tiny_model("featuregate", seed=0).save_pretrained(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    relative, absolute = load_controlled("ckpt"), load_controlled(str((tmp_path / "ckpt").resolve()))
    assert relative.config._name_or_path != absolute.config._name_or_path
    assert model_fingerprint(relative) == model_fingerprint(absolute)
    absolute.config.layer_norm_epsilon = 1e-3
    assert model_fingerprint(relative) != model_fingerprint(absolute)


@pytest.mark.parametrize("which", ["featuregate", "mixtral"])
def test_capture_and_replay_never_hold_the_whole_logits(which, windows, tmp_path, monkeypatch, tiny_mixtral):
    """The audit needs each token's NLL only: its head runs a few rows at a time (here at most 5 of the 6 x 32),
    in capture and replay alike, and the figures are still the model's own, ``correct`` bit-exact."""
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.models import common

    model = tiny_model("featuregate") if which == "featuregate" else load_controlled(tiny_mixtral).eval()
    head = model.lm_head if which == "featuregate" else model.separate_lm_head[0]  # what turns states into logits
    vocab = head.out_features
    monkeypatch.setattr(common, "logits_rows", lambda width, vocab, device: 5)
    rows_seen: list[int] = []
    head.register_forward_hook(lambda module, args, output: rows_seen.append(output.numel() // vocab))
    cache = capture(model, windows, tmp_path / "cache", batch_size=SHARD)
    correct = replay_nll(model, windows, cache, "correct")
    assert rows_seen and max(rows_seen) <= 5
    assert torch.equal(correct, cache.nll(torch.arange(6)))
    with torch.no_grad():
        live = model(windows).logits
    torch.testing.assert_close(correct, reference_nll(live, windows), rtol=0, atol=1e-5)
