"""The FCA invariants of the audit: exact replay, no controller in replay, determinism, seeded and
well-formed interventions, calibration-only profiles, cache fingerprints and resumable capture."""

import json

import jsonschema
import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file

import fca_workbench.audit.capture as capture_module
from fca_workbench.audit.assignment import ConditionCoefficients, calibration_profiles
from fca_workbench.audit.capture import capture
from fca_workbench.audit.interventions import derangement, position_permutations, shuffle_positions
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.results.conditions import CONDITIONS
from fca_workbench.results.schema import validate_audit

NOISY = {"latency_ms", "dense_latency_ms", "latency_ratio_vs_dense"}


def settings(checkpoint, **overrides):
    base = dict(checkpoint=str(checkpoint), window=64, max_windows=12, batch_size=4, latency_repeats=2)
    return AuditSettings(**{**base, **overrides})


def without_latency(tree):
    return {k: without_latency(v) if isinstance(v, dict) else v for k, v in tree.items() if k not in NOISY}


def figures(audit):
    """Everything but wall-clock latency and the paths, which legitimately differ between runs."""
    execution = without_latency(audit["execution"])
    keep = ("conditions", "retention", "variance", "variation")
    return {**{k: audit[k] for k in keep}, "execution": execution, "fingerprint": audit["model"]["fingerprint"]}


@pytest.fixture(scope="module")
def audits(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("audits")
    return {arch: (run_audit(settings(folder), root / arch), root / arch) for arch, folder in tiny_checkpoints.items()}


@pytest.mark.parametrize("arch", ["featuregate", "muddpythia"])
def test_correct_replay_reproduces_the_unperturbed_run(audits, arch):
    audit, out = audits[arch]
    assert abs(audit["conditions"]["correct"]["nll"] - audit["conditions"]["unperturbed"]["nll"]) <= 1e-6
    import csv
    import gzip

    with gzip.open(out / "per_token_nll.csv.gz", "rt") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 12 * 63
    assert max(abs(float(r["correct"]) - float(r["unperturbed"])) for r in rows) <= 1e-5
    assert set(CONDITIONS) <= set(rows[0])


@pytest.mark.parametrize("arch", ["featuregate", "muddpythia"])
def test_audit_reports_full_execution_and_a_valid_schema(audits, arch):
    audit, out = audits[arch]
    validate_audit(json.loads((out / "audit.json").read_text()))
    assert audit["execution"]["fraction_executed"] == 1.0
    assert audit["execution"]["blocks_executed"] == audit["execution"]["blocks_total"]
    assert audit["execution"]["controller_calls"] > 0
    if arch == "featuregate":  # the positive control is audited alongside, and does skip work
        control = audit["execution"]["positive_control"]
        assert 0 < control["fraction_executed"] < 1 and control["flops"] < audit["execution"]["flops"]
    assert set(audit["conditions"]) == set(CONDITIONS)
    assert all(audit["verdict"].values())
    assert audit["data"]["eval"]["windows"] == 12 and audit["data"]["eval"]["window"] == 64


def test_dense_audit_has_only_the_live_condition(audits):
    audit, _ = audits["dense"]
    assert list(audit["conditions"]) == ["unperturbed"]
    assert audit["variance"] is None and audit["execution"]["controller_calls"] == 0


def test_schema_rejects_a_malformed_audit(audits):
    audit = json.loads(json.dumps(audits["featuregate"][0]))
    del audit["execution"]["fraction_executed"]
    with pytest.raises(jsonschema.ValidationError):
        validate_audit(audit)


def test_audit_is_deterministic(tiny_checkpoints, audits, tmp_path):
    again = run_audit(settings(tiny_checkpoints["featuregate"]), tmp_path / "again")
    assert figures(again) == figures(audits["featuregate"][0])


def test_replay_never_calls_a_controller(tiny_checkpoints, tmp_path):
    model = load_model(tiny_checkpoints["muddpythia"])
    session = ReplaySession.open(settings(tiny_checkpoints["muddpythia"]))
    windows, calib = session.windows("eval"), session.windows("calibration")
    cache = capture(model, windows, tmp_path / "eval", batch_size=4)
    profiles = calibration_profiles(capture(model, calib, tmp_path / "calib", batch_size=4), calib)
    calls = []
    handles = [c.register_forward_hook(lambda *_: calls.append(1)) for c in model.controllers]
    for condition in CONDITIONS[1:]:
        replay_nll(model, windows, cache, condition, profiles, seed=3)
        replay_nll(model, windows, cache, condition, profiles, seed=3, controllers=[1])
    assert calls == []
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("n", [2, 3, 5, 17, 100])
def test_cross_input_is_a_seeded_derangement(n):
    for seed in range(20):
        permutation = derangement(n, seed)
        assert sorted(permutation.tolist()) == list(range(n))
        assert not (permutation == torch.arange(n)).any()
        assert torch.equal(permutation, derangement(n, seed))
    with pytest.raises(ValueError):
        derangement(1, 0)


def test_token_shuffle_moves_coefficients_within_windows_the_same_at_every_layer():
    batch, length = 3, 10
    position_code = torch.arange(length, dtype=torch.float).view(1, length, 1, 1)
    coefficients = [position_code.expand(batch, length, 2, 3) + 100 * layer for layer in range(3)]
    permutations = position_permutations(torch.tensor([4, 7, 9]), length, seed=5)
    shuffled = shuffle_positions(coefficients, permutations)
    for layer, tensor in enumerate(shuffled):
        assert torch.equal(tensor[..., 0, 0] - 100 * layer, permutations.float())
        assert torch.equal(tensor.sort(dim=1).values, coefficients[layer])  # a permutation, within each window
    assert not torch.equal(permutations[0], torch.arange(length))
    # a window's shuffle depends on its index and the seed, not on the batch it sits in
    assert torch.equal(position_permutations(torch.tensor([7]), length, 5)[0], permutations[1])


def test_token_shuffle_leaves_the_tokens_alone(tiny_checkpoints, tmp_path):
    model = load_model(tiny_checkpoints["featuregate"])
    windows = ReplaySession.open(settings(tiny_checkpoints["featuregate"])).windows("eval")
    before = windows.clone()
    cache = capture(model, windows, tmp_path / "eval", batch_size=4)
    assign = ConditionCoefficients("token_shuffle", cache, seed=1)
    indices = torch.arange(4)
    correct, shuffled = cache.coefficients(indices), assign(indices)
    permutations = position_permutations(indices, windows.shape[1], 1)
    assert all(
        torch.equal(s, c.gather(1, permutations[..., None, None].expand_as(c))) for s, c in zip(shuffled, correct)
    )
    replay_nll(model, windows, cache, "token_shuffle", seed=1)
    assert torch.equal(windows, before)


def test_static_profiles_come_from_calibration_only(tiny_checkpoints, tmp_path):
    text = tmp_path / "other_eval.txt"
    text.write_text("Now is the winter of our discontent " * 400, encoding="utf-8")
    checkpoint = tiny_checkpoints["featuregate"]
    base = run_audit(settings(checkpoint, latency_repeats=1), tmp_path / "base")
    other_eval = run_audit(settings(checkpoint, eval=str(text), latency_repeats=1), tmp_path / "other_eval")
    other_calib = run_audit(settings(checkpoint, calibration=str(text), latency_repeats=1), tmp_path / "other_calib")
    profiles = {
        name: load_file(tmp_path / name / "static_profiles.safetensors")
        for name in ("base", "other_eval", "other_calib")
    }
    assert all(torch.equal(profiles["base"][k], profiles["other_eval"][k]) for k in profiles["base"])
    assert not torch.equal(profiles["base"]["layer_mean.layer_0"], profiles["other_calib"]["layer_mean.layer_0"])
    assert base["conditions"]["layer_mean"]["nll"] != other_calib["conditions"]["layer_mean"]["nll"]
    assert base["conditions"]["correct"]["nll"] != other_eval["conditions"]["correct"]["nll"]


def test_cache_from_another_model_or_other_data_is_refused(tiny_checkpoints, tmp_path):
    model = load_model(tiny_checkpoints["featuregate"])
    windows = ReplaySession.open(settings(tiny_checkpoints["featuregate"])).windows("eval")
    capture(model, windows, tmp_path / "cache", batch_size=4)
    other = tiny_model("featuregate", seed=7, vocab_size=model.config.vocab_size, window=64)
    with pytest.raises(UserError, match="another model"):
        capture(other, windows, tmp_path / "cache", batch_size=4)
    with pytest.raises(UserError, match="another data"):
        capture(model, windows.flip(0), tmp_path / "cache", batch_size=4)


def test_interrupted_capture_resumes_to_the_same_audit(tiny_checkpoints, audits, tmp_path, monkeypatch):
    real_write, written = capture_module.write_shard, []

    def crash_after_two_shards(tensors, path, binding):
        if len(written) == 2:
            raise KeyboardInterrupt("killed mid-capture")
        written.append(path)
        return real_write(tensors, path, binding)

    monkeypatch.setattr(capture_module, "write_shard", crash_after_two_shards)
    with pytest.raises(KeyboardInterrupt):
        run_audit(settings(tiny_checkpoints["featuregate"]), tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "cache" / "eval" / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert sorted(manifest["shards"]) == sorted(p.name for p in written)  # each written shard is claimed
    assert not (tmp_path / "run" / "audit.json").exists()
    assert not list((tmp_path / "run" / "cache" / "eval").glob(".*.tmp"))
    monkeypatch.setattr(capture_module, "write_shard", real_write)
    resumed = run_audit(settings(tiny_checkpoints["featuregate"]), tmp_path / "run")
    assert figures(resumed) == figures(audits["featuregate"][0])


def test_an_audit_hashes_the_weights_once_for_both_captures(tiny_checkpoints, tmp_path, fingerprint_calls):
    """The model fingerprint hashes every weight (seconds at real sizes): one audit takes it once, and both
    caches' manifests hold that one value, the model's true fingerprint."""
    audit = run_audit(settings(tiny_checkpoints["featuregate"]), tmp_path / "out")
    assert len(fingerprint_calls) == 1
    manifests = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").rglob("manifest.json"))]
    assert len(manifests) == 2  # eval and calibration
    truth = capture_module.model_fingerprint(load_model(tiny_checkpoints["featuregate"]))  # counted, after the count
    assert {m["model_fingerprint"] for m in manifests} == {truth} and audit["model"]["fingerprint"] == truth
