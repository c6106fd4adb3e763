"""The per-layer sweep: every row equals a full frozen one-layer replay, prefix reuse skips the layers before
the intervened one, the full-forward fallback agrees, and ``--per-layer`` audits validate."""

import jsonschema
import pytest
import torch
from conftest import tiny_model
from torch import nn

from fca_workbench.audit.assignment import calibration_profiles
from fca_workbench.audit.capture import capture
from fca_workbench.audit.metrics import bootstrap_counts
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.audit.sweep import FULL_FORWARD, PREFIX, per_layer_sweep, sweep_mode
from fca_workbench.results.conditions import CONDITIONS
from fca_workbench.results.report import format_report
from fca_workbench.results.schema import validate_audit

LAYERS = 3
SWEPT = [c for c in CONDITIONS if c not in ("unperturbed", "correct")]
CONTROLLED = ["featuregate", "muddpythia"]


def random_windows(count, seed):
    return torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=CONTROLLED)
def setup(request, tmp_path):
    """A 3-layer model of one family, 6 eval windows captured in shards of 4 (one partial), profiles from
    other windows."""
    model = tiny_model(request.param, layers=LAYERS)
    windows = random_windows(6, seed=1)
    cache = capture(model, windows, tmp_path / "eval", batch_size=4)
    calibration = random_windows(5, seed=2)
    profiles = calibration_profiles(capture(model, calibration, tmp_path / "calib", batch_size=4), calibration)
    return model, windows, cache, profiles


class WithoutStepping(nn.Module):
    """The same model seen from outside, without the layer-stepping API (as a foreign model would be)."""

    replay_tolerance = 0.0  # it replays through the wrapped model

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def replay_run(self, input_ids, values):
        """The protocol's frozen replay, as every controlled model has it (adapters/protocol.py)."""
        return self.inner.replay_run(input_ids, values)

    @property
    def coefficient_dtypes(self):
        return self.inner.coefficient_dtypes

    @property
    def controller_names(self):
        return self.inner.controller_names

    @property
    def controller_layers(self):
        return self.inner.controller_layers


def sweep(model, windows, cache, profiles, group=None):
    """The per-layer rows; a workbench family has one controller per block, so no per-controller rows."""
    counts = bootstrap_counts(len(windows), 200, seed=0)
    rows = per_layer_sweep(model, windows, cache, SWEPT, profiles, 0, counts, group=group)
    assert rows["per_controller"] == []
    return rows["per_layer"]


@pytest.mark.parametrize("group", [1, len(SWEPT)])
def test_every_row_equals_a_full_one_layer_replay(setup, group):
    model, windows, cache, profiles = setup
    rows = sweep(model, windows, cache, profiles, group)
    assert [(r["layer"], r["condition"]) for r in rows] == [(l, c) for l in range(LAYERS) for c in SWEPT]
    assert all(r["controllers"] == [model.controller_names[r["layer"]]] for r in rows)
    correct = replay_nll(model, windows, cache, "correct").double().mean()
    for row in rows:
        full = replay_nll(model, windows, cache, row["condition"], profiles, 0, [row["layer"]]).double().mean()
        assert abs(row["nll"] - full.item()) <= 1e-6, row
        assert abs(row["delta"] - (full - correct).item()) <= 1e-6, row
        assert row["delta_ci95"][0] <= row["delta"] <= row["delta_ci95"][1]
    assert any(abs(row["delta"]) > 1e-3 for row in rows)  # the interventions really change something


def test_prefix_reuse_never_runs_the_blocks_before_the_layer(setup):
    model, windows, cache, profiles = setup
    calls = [0] * LAYERS
    hooks = [
        block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, block in enumerate(model.blocks)
    ]
    try:
        sweep(model, windows, cache, profiles, group=len(SWEPT))  # one pass per (batch, layer)
    finally:
        for hook in hooks:
            hook.remove()
    batches = len(list(cache.shard_indices()))
    # block b runs in each batch's prefix pass, and in the replay of every layer that resumes at or before b
    expected = [batches * (1 + sum(model.resume_layer(l) <= b for l in range(LAYERS))) for b in range(LAYERS)]
    assert calls == expected
    assert calls[0] < calls[-1]  # full forwards would run every block equally often


def test_fallback_without_layer_stepping_gives_the_same_rows(setup):
    model, windows, cache, profiles = setup
    foreign = WithoutStepping(model)
    assert (sweep_mode(model), sweep_mode(foreign)) == (PREFIX, FULL_FORWARD)
    prefix_rows = sweep(model, windows, cache, profiles)
    fallback_rows = sweep(foreign, windows, cache, profiles)
    assert [(r["layer"], r["condition"]) for r in prefix_rows] == [(r["layer"], r["condition"]) for r in fallback_rows]
    for a, b in zip(prefix_rows, fallback_rows):
        assert abs(a["nll"] - b["nll"]) <= 1e-6 and abs(a["delta"] - b["delta"]) <= 1e-6
        assert all(abs(x - y) <= 1e-6 for x, y in zip(a["delta_ci95"], b["delta_ci95"]))


@pytest.fixture(scope="module")
def per_layer_audits(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("per_layer")
    base = dict(window=64, max_windows=6, batch_size=4, latency_repeats=1, resamples=200, per_layer=True)
    return {
        arch: run_audit(AuditSettings(checkpoint=str(folder), **base), root / arch)
        for arch, folder in tiny_checkpoints.items()
    }


def test_per_layer_audit_validates_and_names_the_carrying_layers(per_layer_audits):
    audit = per_layer_audits["featuregate"]
    layers = len(audit["variation"]["within_std_per_layer"])
    assert len(audit["per_layer"]) == layers * len(SWEPT)
    assert audit["settings"]["per_layer_mode"] == PREFIX
    validate_audit(audit)
    broken = {**audit, "per_layer": [{k: v for k, v in audit["per_layer"][0].items() if k != "delta_ci95"}]}
    with pytest.raises(jsonschema.ValidationError):
        validate_audit(broken)
    cross = [r for r in audit["per_layer"] if r["condition"] == "cross_input"]
    largest = max(cross, key=lambda r: r["delta"])
    assert (
        f"costs most at layer {largest['layer']} ({largest['delta']:+.4f} nats)"
        in audit["verdict"]["assignment_dependence"]
    )
    assert "ΔNLL with the condition at one decoder layer only (all its controllers)" in format_report(audit)


def test_dense_audit_has_an_empty_sweep(per_layer_audits):
    audit = per_layer_audits["dense"]
    assert audit["per_layer"] == []
    validate_audit(audit)
    assert "Per layer" not in audit["verdict"]["assignment_dependence"]
