"""Property-based tests (hypothesis) of the pure core: interventions and metrics, over random layer counts,
slot shapes, window counts, window lengths, batchings and seeds, each checked against numpy."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fca_workbench.audit.interventions import (
    broadcast_profile,
    derangement,
    position_permutations,
    restrict_to,
    shuffle_positions,
    static_profiles,
)
from fca_workbench.audit.metrics import (
    VarianceAccumulator,
    bootstrap_counts,
    bootstrap_means,
    condition_figures,
    gap_retention,
)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

seeds = st.integers(0, 2**31 - 1)
slot_shapes = st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), min_size=1, max_size=4)


@st.composite
def coefficient_sets(draw, min_windows=1, max_windows=7):
    """(per-layer float64 arrays [N, T, *slot], batch boundaries): every layer has its own slot shape."""
    shapes = draw(slot_shapes)
    n = draw(st.integers(min_windows, max_windows))
    length = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(seeds))
    layers = [rng.normal(size=(n, length, *shape)) * rng.uniform(0.1, 3) + rng.normal() * 5 for shape in shapes]
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    return layers, list(zip([0, *cuts], [*cuts, n]))


# ------------------------------------------------------------------------------------------ interventions


@FAST
@given(n=st.integers(2, 60), seed=seeds)
def test_derangement_is_a_seeded_permutation_without_fixed_points(n, seed):
    permutation = derangement(n, seed)
    assert permutation.dtype == torch.long
    assert sorted(permutation.tolist()) == list(range(n))
    assert all(target != source for source, target in enumerate(permutation.tolist()))
    assert torch.equal(permutation, derangement(n, seed))


@pytest.mark.parametrize("n", [3, 4, 10, 60])
def test_derangement_depends_on_the_seed(n):
    """Over the fixed seeds 0-19 the derangements differ (n = 3: both of its two appear). Over arbitrary seeds
    this holds only with high probability (20 seeds agree for n = 3 with probability 2**-19), so it is asserted
    over a stated set."""
    drawn = {tuple(derangement(n, seed).tolist()) for seed in range(20)}
    assert len(drawn) == 2 if n == 3 else len(drawn) > 1


def test_derangement_reaches_every_derangement():
    """Uniform over derangements: for n = 4 all 9 appear over 300 seeds, none far from 300 / 9."""
    counts = {}
    for seed in range(300):
        key = tuple(derangement(4, seed).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 9
    assert all(15 <= c <= 55 for c in counts.values()), counts


@pytest.mark.parametrize("n", [0, 1])
def test_derangement_needs_two_windows(n):
    with pytest.raises(ValueError, match="at least 2 windows"):
        derangement(n, 0)


@FAST
@given(
    indices=st.lists(st.integers(0, 10_000), min_size=1, max_size=6, unique=True), length=st.integers(1, 40), seed=seeds
)
def test_position_permutations_are_per_window_and_seeded(indices, length, seed):
    rows = position_permutations(torch.tensor(indices), length, seed)
    assert rows.shape == (len(indices), length)
    for row, index in zip(rows, indices):
        assert sorted(row.tolist()) == list(range(length))
        # a window's permutation depends on (seed, index) only, not on the other windows of its batch
        assert torch.equal(position_permutations(torch.tensor([index]), length, seed)[0], row)


def test_position_permutations_differ_between_seeds_and_windows():
    """Over a fixed, stated set (seeds 0-4 x windows 0-19, 64 positions) every permutation is a different one and
    none is the identity. Two uniform permutations may coincide by chance (1/720 for 6 positions), so no
    property over arbitrary seeds and windows is asserted; validity and reproducibility are guaranteed and
    checked for any input above."""
    length, seeds_used, windows = 64, range(5), torch.arange(20)
    rows = torch.cat([position_permutations(windows, length, seed) for seed in seeds_used])
    assert len({tuple(row.tolist()) for row in rows}) == len(seeds_used) * len(windows)
    assert not any(torch.equal(row, torch.arange(length)) for row in rows)


@FAST
@given(data=coefficient_sets(), seed=seeds)
def test_shuffle_positions_moves_every_layer_by_the_same_permutation(data, seed):
    layers, _ = data
    n, length = layers[0].shape[:2]
    permutations = position_permutations(torch.arange(n), length, seed)
    shuffled = shuffle_positions([torch.from_numpy(x) for x in layers], permutations)
    p = permutations.numpy()
    for x, out in zip(layers, shuffled):
        expected = np.stack([x[b, p[b]] for b in range(n)])
        np.testing.assert_array_equal(out.numpy(), expected)


@FAST
@given(data=coefficient_sets())
def test_static_profiles_equal_numpy_means_over_windows(data):
    layers, batches = data
    profiles = static_profiles([torch.from_numpy(x[a:b]) for x in layers] for a, b in batches)
    assert set(profiles) == {"global_mean", "layer_scalar", "layer_mean", "layer_position_mean"}
    everything = np.concatenate([x.ravel() for x in layers])
    for layer, x in enumerate(layers):
        expected = {
            "layer_position_mean": x.mean(axis=0),
            "layer_mean": x.mean(axis=(0, 1)),
            "layer_scalar": x.mean(),
            "global_mean": everything.mean(),
        }
        for name, value in expected.items():
            got = profiles[name][layer]
            assert got.dtype == torch.float32 and got.shape == np.shape(value), name
            np.testing.assert_allclose(got.numpy(), value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_static_profiles_need_a_window():
    with pytest.raises(ValueError, match="^static profiles need at least one calibration window$"):
        static_profiles([])
    with pytest.raises(ValueError, match="^static profiles need at least one calibration window$"):
        static_profiles([[torch.zeros(0, 3, 2)]])


@FAST
@given(data=coefficient_sets(), batch=st.integers(1, 3), cut=st.integers(0, 5))
def test_broadcast_profile_gives_every_token_the_profile(data, batch, cut):
    layers, _ = data
    slots = [x.shape[2:] for x in layers]
    profiles = static_profiles([[torch.from_numpy(x) for x in layers]])
    length = max(1, layers[0].shape[1] - cut)
    for name, profile in profiles.items():
        out = broadcast_profile(profile, slots, batch, length)
        for tensor, value, slot in zip(out, profile, slots):
            assert tensor.shape == (batch, length, *slot) and tensor.is_contiguous()
            value = value[:length] if name == "layer_position_mean" else value
            expected = np.broadcast_to(value.numpy(), (batch, length, *slot))
            np.testing.assert_array_equal(tensor.numpy(), expected)


@FAST
@given(data=coefficient_sets())
def test_broadcast_profile_refuses_a_window_longer_than_the_position_profile(data):
    layers, _ = data
    profile = static_profiles([[torch.from_numpy(x) for x in layers]])["layer_position_mean"]
    length = layers[0].shape[1]
    with pytest.raises(ValueError, match=f"covers {length} positions"):
        broadcast_profile(profile, [x.shape[2:] for x in layers], 1, length + 1)


@FAST
@given(layers=st.integers(1, 6), data=st.data())
def test_restrict_to_layer_changes_exactly_one_layer(layers, data):
    layer = data.draw(st.integers(0, layers - 1))
    correct = [torch.full((1, 2, 3), float(i)) for i in range(layers)]
    intervened = [torch.full((1, 2, 3), -1.0 - i) for i in range(layers)]
    out = restrict_to(intervened, correct, [layer])
    assert len(out) == layers
    for i, tensor in enumerate(out):
        assert tensor is (intervened[i] if i == layer else correct[i])
    for bad in (-1, layers):
        with pytest.raises(ValueError, match="out of range"):
            restrict_to(intervened, correct, [bad])


# ------------------------------------------------------------------------------------------ metrics


@st.composite
def window_nlls(draw):
    """Per-window NLL of correct / a profile / global_mean, with a real gap between correct and global_mean."""
    n = draw(st.integers(2, 40))
    rng = np.random.default_rng(draw(seeds))
    correct = 3 + rng.normal(size=n)
    gap = draw(st.floats(0.05, 2.0))
    share = draw(st.floats(-0.5, 1.5))
    noise = draw(st.floats(0, 0.2))
    return {
        "correct": correct,
        "global_mean": correct + gap + noise * rng.normal(size=n),
        "layer_mean": correct + (1 - share) * gap + noise * rng.normal(size=n),
    }


@FAST
@given(nll=window_nlls(), seed=seeds)
def test_gap_retention_equals_the_formula_on_every_resample(nll, seed):
    g, p, c = nll["global_mean"], nll["layer_mean"], nll["correct"]
    counts = bootstrap_counts(len(c), resamples=200, seed=seed)
    w = counts.numpy() / len(c)
    gap_low, gap_high = np.percentile(w @ g - w @ c, [2.5, 97.5])
    got = gap_retention({k: torch.from_numpy(v) for k, v in nll.items()}, "layer_mean", counts)
    assert got["denominator"]["value"] == pytest.approx(g.mean() - c.mean(), rel=1e-9, abs=1e-12)
    assert got["numerator"]["value"] == pytest.approx(g.mean() - p.mean(), rel=1e-9, abs=1e-12)
    assert got["resolved"] == bool(gap_low > 0 or gap_high < 0)
    if not got["resolved"]:  # a gap whose CI holds 0: no ratio
        assert got["value"] is None and got["ci95"] == [None, None]
        return
    assert got["value"] == pytest.approx((g.mean() - p.mean()) / (g.mean() - c.mean()), rel=1e-9, abs=1e-12)
    ratios = (w @ g - w @ p) / (w @ g - w @ c)
    np.testing.assert_allclose(got["ci95"], np.nanpercentile(ratios, [2.5, 97.5]), rtol=1e-9, atol=1e-12)


@FAST
@given(nll=window_nlls())
def test_gap_retention_is_undefined_without_a_gap(nll):
    nll = {**nll, "global_mean": nll["correct"].copy()}
    counts = bootstrap_counts(len(nll["correct"]), resamples=50, seed=0)
    got = gap_retention({k: torch.from_numpy(v) for k, v in nll.items()}, "layer_mean", counts)
    assert (got["value"], got["ci95"], got["resolved"]) == (None, [None, None], False)
    assert got["denominator"] == {"value": 0.0, "ci95": [0.0, 0.0]}


@FAST
@given(n=st.integers(2, 50), resamples=st.integers(1, 60), seed=seeds)
def test_bootstrap_counts_resample_n_windows_with_replacement(n, resamples, seed):
    counts = bootstrap_counts(n, resamples, seed)
    assert counts.shape == (resamples, n) and counts.dtype == torch.int64
    assert (counts >= 0).all() and (counts.sum(1) == n).all()
    assert torch.equal(counts, bootstrap_counts(n, resamples, seed))


@FAST
@given(nll=window_nlls(), seed=seeds)
def test_condition_figures_are_paired_means(nll, seed):
    n = len(nll["correct"])
    counts = bootstrap_counts(n, resamples=100, seed=seed)
    figures = condition_figures({k: torch.from_numpy(v) for k, v in nll.items()}, counts)
    w = counts.numpy() / n
    for name, values in nll.items():
        diff = values - nll["correct"]
        assert figures[name]["nll"] == pytest.approx(values.mean(), abs=1e-12)
        assert figures[name]["delta"] == pytest.approx(diff.mean(), abs=1e-12)
        np.testing.assert_allclose(figures[name]["ci95"], np.percentile(w @ values, [2.5, 97.5]), atol=1e-12)
        np.testing.assert_allclose(figures[name]["delta_ci95"], np.percentile(w @ diff, [2.5, 97.5]), atol=1e-12)
        np.testing.assert_allclose(bootstrap_means(torch.from_numpy(values), counts).numpy(), w @ values, atol=1e-12)


def lstsq_r2(values, groups):
    """R² of a least-squares fit of one mean per group (one-hot design), by numpy's lstsq."""
    _, group = np.unique(groups, axis=0, return_inverse=True)
    design = np.eye(group.max() + 1)[group.ravel()]
    fitted = design @ np.linalg.lstsq(design, values, rcond=None)[0]
    total = ((values - values.mean()) ** 2).sum()
    return 1 - ((values - fitted) ** 2).sum() / total


@FAST
@given(data=coefficient_sets(min_windows=1, max_windows=5))
def test_variance_decomposition_equals_least_squares(data):
    layers, batches = data
    accumulator = VarianceAccumulator()
    for a, b in batches:
        accumulator.update([torch.from_numpy(x[a:b]) for x in layers], window_offset=a)
    got = accumulator.result()

    values, labels, slot_offset = [], [], 0
    for layer, x in enumerate(layers):
        n, length = x.shape[:2]
        flat = x.reshape(n, length, -1)
        w, p, s = np.meshgrid(np.arange(n), np.arange(length), np.arange(flat.shape[2]), indexing="ij")
        values.append(flat.ravel())
        labels.append(np.stack([np.full(flat.size, layer), slot_offset + s.ravel(), p.ravel(), w.ravel()], axis=1))
        slot_offset += flat.shape[2]
    values, labels = np.concatenate(values), np.concatenate(labels)
    assume(((values - values.mean()) ** 2).sum() > 1e-6)
    for key, columns in (
        ("r2_layer", [0]),
        ("r2_layer_slot", [1]),
        ("r2_layer_slot_position", [1, 2]),
        ("r2_layer_slot_window", [1, 3]),
    ):
        assert got[key] == pytest.approx(lstsq_r2(values, labels[:, columns]), abs=1e-8), key

    per_slot = [values[labels[:, 1] == s] for s in range(slot_offset)]
    assert got["within_std"] == pytest.approx(np.mean([v.std() for v in per_slot]), rel=1e-9, abs=1e-12)
    assert got["cv"] == pytest.approx(np.mean([v.std() / abs(v.mean()) for v in per_slot]), rel=1e-7)
    layer_of_slot = np.array([labels[labels[:, 1] == s][0, 0] for s in range(slot_offset)])
    stds = np.array([v.std() for v in per_slot])
    np.testing.assert_allclose(
        got["within_std_per_layer"], [stds[layer_of_slot == layer].mean() for layer in range(len(layers))], rtol=1e-9
    )
