"""Never a figure that is silently wrong (issue 23, class 1): non-finite numbers in any condition stop every path
that computes figures with one line; cache shards are bound to what made them; every audit checks that
``correct`` reproduces ``unperturbed``; audit.json is strict JSON and records its static profiles' sha256."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file

from fca_workbench.audit.assignment import calibration_profiles
from fca_workbench.audit.capture import MANIFEST, capture, model_fingerprint
from fca_workbench.audit.metrics import bootstrap_counts, gap_retention
from fca_workbench.audit.mini import MiniAudit
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.audit.sweep import per_layer_sweep
from fca_workbench.data.corpus import DATA_DIR
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json
from fca_workbench.results.layout import AUDIT_FILE, PER_TOKEN_CSV, PROFILES_FILE
from fca_workbench.results.verdicts import verdicts

SHIPPED = DATA_DIR / "checkpoints"


def quick(checkpoint, **extra) -> AuditSettings:
    return AuditSettings(
        checkpoint=str(checkpoint), window=32, max_windows=4, batch_size=2, resamples=50, latency_repeats=1, **extra
    )


def poisoned_copy(folder: Path, out: Path, key: str) -> Path:
    """A copy of checkpoint ``folder`` whose weight ``key`` holds one NaN (its first entry)."""
    shutil.copytree(folder, out)
    weights = load_file(out / "model.safetensors")
    assert key in weights, sorted(weights)[:10]
    weights[key].view(-1)[0] = float("nan")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def assert_nothing_written(out: Path) -> None:
    assert not (out / AUDIT_FILE).exists() and not (out / PER_TOKEN_CSV).exists()
    for manifest in out.rglob(MANIFEST):
        assert json.loads(manifest.read_text())["complete"] is False, manifest


def test_one_nan_in_one_controller_bias_of_a_shipped_checkpoint_is_one_line_and_nothing_written(tmp_path):
    poisoned = poisoned_copy(SHIPPED / "featuregate-s0", tmp_path / "fg", "h.2.controller.proj.bias")
    out = tmp_path / "out"
    args = ["audit", poisoned, "--max-windows", "4", "--window", "32", "--batch-size", "2", "--out", out]
    result = subprocess.run([sys.executable, "-m", "fca_workbench", *map(str, args)], capture_output=True)
    stderr = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in stderr
    # what a terminal shows: each line as its last carriage return leaves it (the progress bar clears itself)
    shown = [line.rsplit("\r", 1)[-1] for line in stderr.split("\n") if line.rsplit("\r", 1)[-1].strip()]
    assert len(shown) == 1 and shown[0].startswith("fca: error: non-finite"), stderr
    assert "condition 'unperturbed' in eval window 0" in shown[0] and "h.2.controller" in shown[0]
    assert_nothing_written(out)


def test_one_nan_in_a_foreign_mixtral_router_stops_the_audit(tiny_mixtral, tmp_path):
    poisoned = poisoned_copy(tiny_mixtral, tmp_path / "mixtral", "model.layers.1.block_sparse_moe.gate.weight")
    with pytest.raises(UserError, match=r"non-finite .* under condition 'unperturbed' in eval window 0"):
        run_audit(quick(poisoned), tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A tiny FeatureGate, its windows, eval and calibration caches and profiles."""
    root = tmp_path_factory.mktemp("captured")
    model = tiny_model("featuregate")
    windows = torch.randint(0, 64, (6, 16), generator=torch.Generator().manual_seed(3))
    cache = capture(model, windows, root / "eval", batch_size=2)
    calibration = windows.flip(0)
    profiles = calibration_profiles(capture(model, calibration, root / "calibration", batch_size=2), calibration)
    return model, windows, cache, profiles


def with_nan(profiles: dict, name: str) -> dict:
    poisoned = {key: [t.clone() for t in layers] for key, layers in profiles.items()}
    poisoned[name][1].view(-1)[0] = float("nan")
    return poisoned


def test_a_nan_that_only_one_condition_meets_is_named_with_its_window(captured):
    model, windows, cache, profiles = captured
    assert torch.isfinite(replay_nll(model, windows, cache, "layer_mean", profiles)).all()
    with pytest.raises(UserError, match="NLL .* under condition 'layer_mean' in eval window 0"):
        replay_nll(model, windows, cache, "layer_mean", with_nan(profiles, "layer_mean"))


def test_the_per_layer_sweep_names_the_condition_and_layer(captured):
    model, windows, cache, profiles = captured
    counts = bootstrap_counts(len(windows), 20)
    with pytest.raises(UserError, match="condition 'layer_mean at layer 1' in eval window 0"):
        per_layer_sweep(model, windows, cache, ["layer_mean"], with_nan(profiles, "layer_mean"), 0, counts)


def test_the_mini_audit_of_a_model_with_a_nan_weight_stops():
    model = tiny_model("featuregate")
    windows = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(4))
    mini = MiniAudit(windows, windows.flip(0), batch_size=2, resamples=20)
    assert set(mini(model))  # finite weights: figures
    with torch.no_grad():
        model.controllers[0].proj.bias[0] = float("nan")
    with pytest.raises(UserError, match="non-finite .* condition 'unperturbed' in eval window 0"):
        mini(model)


def test_verdicts_refuse_a_figure_that_is_not_finite(healthy):
    audit, _ = healthy
    assert verdicts(audit) == audit["verdict"]
    for section, key in (("conditions", "cross_input"), ("variation", None)):
        broken = json.loads(json.dumps(audit))
        if key is None:
            broken[section]["cv"] = float("inf")
        else:
            broken[section][key]["delta_ci95"][0] = float("nan")
        with pytest.raises(UserError, match=f"audit figure {section}.* is not a finite number"):
            verdicts(broken)


def test_a_retention_ci_the_resamples_leave_unbounded_is_null_not_infinite():
    """Two windows: every resample that draws one window twice has no gap (a ratio over 0), so the gap's CI holds
    0: no ratio at all, and nothing infinite in the file."""
    window_nll = {
        "global_mean": torch.tensor([1.0, 2.0], dtype=torch.float64),
        "correct": torch.tensor([1.0, 1.0], dtype=torch.float64),
        "layer_mean": torch.tensor([2.0, 1.5], dtype=torch.float64),
    }
    retention = gap_retention(window_nll, "layer_mean", bootstrap_counts(2, 200))
    assert retention["denominator"]["value"] == pytest.approx(1.5 - 1.0)
    assert retention["denominator"]["ci95"][0] == 0.0
    assert (retention["value"], retention["ci95"], retention["resolved"]) == (None, [None, None], False)
    json.dumps(retention, allow_nan=False)


@pytest.fixture(scope="module")
def healthy(tiny_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    return run_audit(quick(tiny_checkpoints["featuregate"]), out), out


def test_audit_json_is_strict_and_records_the_invariant_and_the_profiles_hash(healthy):
    audit, out = healthy
    written = read_json(out / AUDIT_FILE)  # refuses NaN and Infinity
    assert written["replay_check"] == {"max_abs_difference": 0.0, "tolerance": 0.0}
    profiles_bytes = (out / PROFILES_FILE).read_bytes()
    assert written["static_profiles"] == {"sha256": hashlib.sha256(profiles_bytes).hexdigest()}
    assert written == audit


def test_every_family_declares_its_replay_tolerance(tiny_mixtral):
    from fca_workbench.adapters.controlled import load_controlled

    assert tiny_model("featuregate").replay_tolerance == 0.0
    assert tiny_model("muddpythia").replay_tolerance == 0.0
    assert load_controlled(tiny_mixtral).replay_tolerance == 0.0  # transformers' own class, eager experts


def shard_claims(folder: Path) -> dict:
    return {
        p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}
        for p in folder.glob("shard_*.safetensors")
    }


def adopt_shards(source: Path, target: Path, rebind: dict | None = None) -> None:
    """Copy ``source``'s shards over ``target``'s and make ``target``'s manifest claim them with their true hashes;
    with ``rebind``, also rewrite each shard's own binding to ``rebind`` (a forger who knows the format)."""
    for shard in sorted(source.glob("shard_*.safetensors")):
        if rebind is None:
            shutil.copy(shard, target / shard.name)
            continue
        with safe_open(shard, framework="pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            binding = json.loads(handle.metadata()["fca_binding"])
        binding.update(rebind)
        (target / shard.name).write_bytes(save(tensors, metadata={"fca_binding": json.dumps(binding, sort_keys=True)}))
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["shards"] = shard_claims(target)
    (target / MANIFEST).write_text(json.dumps(manifest))


def test_a_manifest_claiming_another_models_shards_with_their_true_hashes_is_refused(tmp_path):
    """The issue's case: shards of featuregate-s1 copied into featuregate-s0's cache, its manifest's hashes
    rewritten to theirs. Adopted, they flipped the verdict; now the cache is refused, naming the shard."""
    s0, s1 = SHIPPED / "featuregate-s0", SHIPPED / "featuregate-s1"
    first = run_audit(quick(s0), tmp_path / "s0")
    run_audit(quick(s1), tmp_path / "s1")
    adopt_shards(tmp_path / "s1" / "cache" / "eval", tmp_path / "s0" / "cache" / "eval")
    with pytest.raises(UserError, match="shard_00000.safetensors belongs to another capture .*model_fingerprint"):
        run_audit(quick(s0), tmp_path / "s0")
    assert read_json(tmp_path / "s0" / AUDIT_FILE) == first  # the earlier audit stands, untouched


def test_a_forged_binding_is_caught_by_the_invariant(tmp_path):
    """Shards of s1 rebound to s0's fingerprints pass every check of the cache, but ``correct`` (s0 replaying
    s1's coefficients) no longer reproduces ``unperturbed`` (s1's NLL): the audit stops."""
    s0, s1 = SHIPPED / "featuregate-s0", SHIPPED / "featuregate-s1"
    run_audit(quick(s0), tmp_path / "s0")
    run_audit(quick(s1), tmp_path / "s1")
    own = json.loads((tmp_path / "s0" / "cache" / "eval" / MANIFEST).read_text())
    (tmp_path / "s0" / AUDIT_FILE).unlink()
    adopt_shards(
        tmp_path / "s1" / "cache" / "eval",
        tmp_path / "s0" / "cache" / "eval",
        rebind={"model_fingerprint": own["model_fingerprint"]},
    )
    with pytest.raises(UserError, match="frozen replay of 'correct' does not reproduce the unperturbed run"):
        run_audit(quick(s0), tmp_path / "s0")
    assert not (tmp_path / "s0" / AUDIT_FILE).exists()


def test_a_resumed_capture_recaptures_a_claimed_shard_bound_to_another_model(tmp_path):
    windows = torch.randint(0, 64, (6, 16), generator=torch.Generator().manual_seed(5))
    mine, other = tiny_model("featuregate", seed=0), tiny_model("featuregate", seed=7)
    capture(other, windows, tmp_path / "other", batch_size=2)
    capture(mine, windows, tmp_path / "mine", batch_size=2)
    adopt_shards(tmp_path / "other", tmp_path / "mine")
    manifest = json.loads((tmp_path / "mine" / MANIFEST).read_text())
    manifest["complete"] = False  # an interrupted capture: claimed shards are resumed from, if they are its own
    (tmp_path / "mine" / MANIFEST).write_text(json.dumps(manifest))
    cache = capture(mine, windows, tmp_path / "mine", batch_size=2)
    with torch.no_grad():
        live = torch.cat([mine(windows[i : i + 2]).logits for i in range(0, 6, 2)])
    from fca_workbench.models import next_token_nll

    assert torch.equal(cache.nll(torch.arange(6)), next_token_nll(live, windows))
    assert model_fingerprint(mine) == cache.manifest["model_fingerprint"]
