"""Tests of fca_workbench.metrics against direct numpy computations and known answers."""

import json

import numpy as np
import pytest
import torch

from fca_workbench.audit.metrics import (
    VarianceAccumulator,
    bootstrap_counts,
    bootstrap_means,
    condition_figures,
    gap_retention,
    mean_ci,
)

N_WIN, T = 7, 5
SLOT_SHAPES = [(2, 3), (4, 2), (4, 3), (1,)]  # different per layer, as in MUDDPythia
BATCHES = [(0, 3), (3, 3), (6, 1)]  # uneven: windows 0-2, 3-5, 6


# ------------------------------------------------------------------ variance decomposition


def synthetic(layer=1.0, slot=0.0, position=0.0, window=0.0, noise=0.0, seed=0, offset=0.0):
    """Full coefficients per layer, [N_WIN, T, *slot_shape], as a sum of named effects."""
    rng = np.random.default_rng(seed)
    out = []
    for l, shape in enumerate(SLOT_SHAPES):
        full = (N_WIN, T, *shape)
        x = (
            offset
            + layer * (l + 1)
            + slot * rng.normal(size=(1, 1, *shape))
            + position * rng.normal(size=(1, T, *(1 for _ in shape)))
            + window * rng.normal(size=(N_WIN, 1, *(1 for _ in shape)))
            + noise * rng.normal(size=full)
        )
        out.append(np.broadcast_to(x, full).copy())
    return out


def accumulate(full, batches=BATCHES):
    acc = VarianceAccumulator()
    for start, size in batches:
        acc.update([torch.from_numpy(x[start : start + size]) for x in full], window_offset=start)
    return acc.result()


def numpy_reference(full):
    """Direct, non-streaming computation on all entries pooled (labels per entry)."""
    vals, labels = [], []
    slot_base = 0
    for l, x in enumerate(full):
        x = x.reshape(N_WIN, T, -1)
        w, p, s = np.meshgrid(np.arange(N_WIN), np.arange(T), np.arange(x.shape[2]), indexing="ij")
        vals.append(x.ravel())
        labels.append(np.stack([np.full(x.size, l), slot_base + s.ravel(), p.ravel(), w.ravel()], axis=1))
        slot_base += x.shape[2]
    v, lab = np.concatenate(vals), np.concatenate(labels)

    def ss_within(cols):
        _, inv = np.unique(lab[:, cols], axis=0, return_inverse=True)
        inv = inv.ravel()
        means = np.bincount(inv, weights=v) / np.bincount(inv)
        return ((v - means[inv]) ** 2).sum()

    total = ((v - v.mean()) ** 2).sum()
    r2 = {
        name: 1 - ss_within(cols) / total
        for name, cols in [
            ("r2_layer", [0]),
            ("r2_layer_slot", [1]),
            ("r2_layer_slot_position", [1, 2]),
            ("r2_layer_slot_window", [1, 3]),
        ]
    }
    groups = [v[lab[:, 1] == g] for g in range(slot_base)]
    stds = np.array([g.std() for g in groups])
    layer_of_slot = np.array([lab[lab[:, 1] == g][0, 0] for g in range(slot_base)])
    return {
        **r2,
        "within_std": stds.mean(),
        "cv": np.mean([g.std() / abs(g.mean()) for g in groups]),
        "within_std_per_layer": [stds[layer_of_slot == l].mean() for l in range(len(full))],
    }


@pytest.mark.parametrize("offset", [0.0, 1e5])
def test_variance_matches_numpy(offset):
    # offset 1e5 with unit-scale effects: a naive sum of squares loses ~6 digits here.
    full = synthetic(layer=1.0, slot=0.5, position=0.3, window=0.4, noise=0.2, offset=offset)
    got, ref = accumulate(full), numpy_reference(full)
    assert set(got) == set(ref)
    for key, value in ref.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-9, atol=1e-9, err_msg=key)
    assert 0 < got["r2_layer"] < got["r2_layer_slot"] < got["r2_layer_slot_position"] < 1
    assert got["r2_layer_slot"] < got["r2_layer_slot_window"] < 1


def test_variance_independent_of_batching_and_order():
    full = synthetic(slot=0.5, position=0.3, window=0.4, noise=0.2, seed=3)
    one_batch = accumulate(full, [(0, N_WIN)])
    shuffled = accumulate(full, [(6, 1), (2, 4), (0, 2)])
    for key in one_batch:
        np.testing.assert_allclose(shuffled[key], one_batch[key], rtol=1e-12, err_msg=key)


def test_variance_known_answers():
    layer_only = accumulate(synthetic(layer=1.0))
    for key in ("r2_layer", "r2_layer_slot", "r2_layer_slot_position", "r2_layer_slot_window"):
        assert layer_only[key] == pytest.approx(1.0, abs=1e-12)
    assert layer_only["within_std"] == 0.0 and layer_only["cv"] == 0.0

    noisy = accumulate(synthetic(noise=0.5, seed=1))
    positional = accumulate(synthetic(noise=0.5, position=2.0, seed=1))
    by_window = accumulate(synthetic(noise=0.5, window=2.0, seed=1))
    assert positional["r2_layer_slot_position"] > noisy["r2_layer_slot_position"] + 0.1
    assert positional["r2_layer_slot_position"] - positional["r2_layer_slot"] > 0.5
    assert by_window["r2_layer_slot_window"] - by_window["r2_layer_slot"] > 0.5
    assert by_window["r2_layer_slot_position"] - by_window["r2_layer_slot"] < 0.05
    # Pure noise: position and window identity explain only their small-sample share.
    assert noisy["r2_layer_slot_window"] - noisy["r2_layer_slot"] < 0.1


@pytest.mark.parametrize("value", [0.3, 0.01])  # values whose float sums do not round-trip
def test_variance_constant(value):
    constant = accumulate([np.full((N_WIN, T, *s), value) for s in SLOT_SHAPES])
    assert constant["r2_layer"] is None and constant["r2_layer_slot_window"] is None
    assert constant["within_std"] == 0.0 and constant["cv"] == 0.0
    assert constant["within_std_per_layer"] == [0.0] * len(SLOT_SHAPES)


def test_variance_without_coefficients():
    acc = VarianceAccumulator()
    assert acc.result() is None
    acc.update([], window_offset=0)
    acc.update([], window_offset=1)
    assert acc.result() is None


def test_variance_rejects_changed_layers():
    acc = VarianceAccumulator()
    acc.update([torch.zeros(1, T, 2), torch.zeros(1, T, 3)], 0)
    with pytest.raises(ValueError, match="^got 1 layers, expected 2$"):
        acc.update([torch.zeros(1, T, 2)], 1)
    with pytest.raises(ValueError, match="^slot count changed from 3 to 4$"):
        acc.update([torch.zeros(1, T, 2), torch.zeros(1, T, 4)], 1)
    one_position = VarianceAccumulator()  # windows of a single position
    one_position.update([torch.zeros(1, 1, 2)], 0)
    with pytest.raises(ValueError, match="^slot count changed from 2 to 3$"):
        one_position.update([torch.zeros(1, 1, 3)], 1)


def test_a_slot_that_is_always_zero_has_cv_zero():
    """sd 0 and mean 0: the CV is 0 by definition, not 0/0."""
    full = synthetic(noise=0.5, seed=2)
    full[0][..., 0, 0] = 0.0  # layer 0, slot (0, 0): always exactly 0
    got = accumulate(full)
    assert np.isfinite(got["cv"])
    groups = [x.reshape(N_WIN * T, -1) for x in full]
    cvs = [0.0 if g.std() == 0 else g.std() / abs(g.mean()) for x in groups for g in x.T]
    assert got["cv"] == pytest.approx(np.mean(cvs), rel=1e-9)


# ------------------------------------------------------------------ bootstrap


def test_bootstrap_counts():
    counts = bootstrap_counts(50, resamples=200, seed=1)
    assert counts.shape == (200, 50) and counts.dtype == torch.int64
    assert (counts.sum(1) == 50).all() and (counts >= 0).all()
    assert torch.equal(counts, bootstrap_counts(50, resamples=200, seed=1))
    assert not torch.equal(counts, bootstrap_counts(50, resamples=200, seed=2))
    assert torch.equal(bootstrap_counts(5), bootstrap_counts(5, resamples=1000, seed=0))  # the defaults
    with pytest.raises(ValueError, match="^bootstrap needs at least 2 windows, got 1$"):
        bootstrap_counts(1)
    with pytest.raises(ValueError, match="^resamples must be >= 1, got 0$"):
        bootstrap_counts(5, resamples=0)


def test_bootstrap_means_and_ci_match_direct_resampling():
    values = torch.randn(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = bootstrap_counts(30, seed=4)
    direct = np.array([np.repeat(values.numpy(), c).mean() for c in counts.numpy()])
    np.testing.assert_allclose(bootstrap_means(values, counts).numpy(), direct, rtol=1e-12)
    point, lo, hi = mean_ci(values, counts)
    assert point == pytest.approx(values.mean().item(), abs=1e-15)
    np.testing.assert_allclose([lo, hi], np.percentile(direct, [2.5, 97.5]), rtol=1e-12)
    with pytest.raises(ValueError, match=r"^window_values has shape \(10,\), counts expect \[30\]$"):
        bootstrap_means(values[:10], counts)


def test_float32_window_values_are_figured_in_float64():
    """Capture stores NLL in float32; means, differences and ratios must still be taken in float64
    (here float32 would lose the 0.5 of a mean and the 0.1 of a difference)."""
    as32 = {
        "correct": [0.1, 0.1, 3.0, 5.0],
        "global_mean": [2.0**24, 1.0, 2.0**24, 1.0],
        "layer_mean": [2.0**23, 2.0, 2.0**23, 4.0],
    }
    nll32 = {k: torch.tensor(v, dtype=torch.float32) for k, v in as32.items()}
    exact = {k: v.numpy().astype(np.float64) for k, v in nll32.items()}  # the same float32 numbers, in float64
    counts = bootstrap_counts(4, resamples=50, seed=3)
    w = counts.numpy() / 4
    np.testing.assert_allclose(
        bootstrap_means(nll32["global_mean"], counts).numpy(), w @ exact["global_mean"], rtol=1e-15
    )
    assert mean_ci(nll32["global_mean"], counts)[0] == exact["global_mean"].mean()
    figures = condition_figures(nll32, counts)
    assert figures["global_mean"]["delta"] == pytest.approx((exact["global_mean"] - exact["correct"]).mean(), rel=1e-15)
    g, p, c = (exact[k].mean() for k in ("global_mean", "layer_mean", "correct"))
    assert gap_retention(nll32, "layer_mean", counts)["value"] == pytest.approx((g - p) / (g - c), rel=1e-15)


def test_ci_contains_point_and_shrinks_with_more_windows():
    gen = torch.Generator().manual_seed(0)
    widths = []
    for n in (20, 2000):
        values = 3.0 + torch.randn(n, generator=gen, dtype=torch.float64)
        point, lo, hi = mean_ci(values, bootstrap_counts(n, seed=0))
        assert lo < point < hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 4  # ~1/sqrt(100)


def test_ci_seeded():
    values = torch.randn(40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    same = [mean_ci(values, bootstrap_counts(40, seed=7)) for _ in range(2)]
    other = mean_ci(values, bootstrap_counts(40, seed=8))
    assert same[0] == same[1]
    assert same[0][1:] != other[1:]


def windows(n=200, seed=0):
    """Per-window NLLs with a large shared between-window spread, as real eval windows have."""
    gen = torch.Generator().manual_seed(seed)
    base = 4.0 + torch.randn(n, generator=gen, dtype=torch.float64)

    def small():
        return 0.01 * torch.randn(n, generator=gen, dtype=torch.float64)

    return {
        "correct": base,
        "global_mean": base + 0.5 + small(),
        "layer_mean": base + 0.02 + small(),
        "cross_input": base + 0.3 + small(),
    }


def test_condition_figures_paired_delta():
    nll = windows()
    counts = bootstrap_counts(200, seed=0)
    figs = condition_figures(nll, counts)
    assert list(figs) == list(nll)
    for name, fig in figs.items():
        assert set(fig) == {"nll", "ci95", "delta", "delta_ci95"}
        assert all(type(x) is float for x in [fig["nll"], fig["delta"], *fig["ci95"], *fig["delta_ci95"]]), name
        assert fig["ci95"][0] < fig["nll"] < fig["ci95"][1]
        assert fig["delta"] == pytest.approx((nll[name] - nll["correct"]).mean().item(), abs=1e-12)
    assert figs["correct"]["delta"] == 0.0 and figs["correct"]["delta_ci95"] == [0.0, 0.0]
    json.dumps(figs)

    # Unpaired: the two conditions resampled independently.
    unpaired = bootstrap_means(nll["cross_input"], counts) - bootstrap_means(
        nll["correct"], bootstrap_counts(200, seed=1)
    )
    lo, hi = np.percentile(unpaired.numpy(), [2.5, 97.5])
    paired_lo, paired_hi = figs["cross_input"]["delta_ci95"]
    assert paired_lo < 0.3 < paired_hi
    assert paired_hi - paired_lo < (hi - lo) / 20


# ------------------------------------------------------------------ gap retention


def test_gap_retention_matches_direct():
    nll = windows()
    counts = bootstrap_counts(200, seed=5)
    got = gap_retention(nll, "layer_mean", counts)
    g, p, c = (nll[k].numpy() for k in ("global_mean", "layer_mean", "correct"))
    assert got["value"] == pytest.approx((g.mean() - p.mean()) / (g.mean() - c.mean()), rel=1e-12)
    w = counts.numpy().astype(float) / 200
    ratios = (w @ g - w @ p) / (w @ g - w @ c)
    np.testing.assert_allclose(got["ci95"], np.percentile(ratios, [2.5, 97.5]), rtol=1e-10)
    assert got["ci95"][0] < got["value"] < got["ci95"][1] < 1
    assert set(got) == {"value", "ci95", "resolved", "reference", "numerator", "denominator"}
    assert got["resolved"] is True and got["reference"] == "global_mean"
    # both ends: the reference's ΔNLL over correct and the profile's gain over the reference, each with the
    # percentile interval of the same resamples
    assert got["denominator"]["value"] == pytest.approx(g.mean() - c.mean(), rel=1e-12)
    assert got["numerator"]["value"] == pytest.approx(g.mean() - p.mean(), rel=1e-12)
    np.testing.assert_allclose(got["denominator"]["ci95"], np.percentile(w @ g - w @ c, [2.5, 97.5]), rtol=1e-10)
    np.testing.assert_allclose(got["numerator"]["ci95"], np.percentile(w @ g - w @ p, [2.5, 97.5]), rtol=1e-10)
    json.dumps(got)


def test_a_retention_whose_gap_does_not_resolve_is_no_figure():
    rng = np.random.default_rng(3)
    correct = rng.normal(5.0, 0.5, 200)
    nll = {
        "correct": torch.tensor(correct),
        "global_mean": torch.tensor(correct + rng.normal(0.0, 0.05, 200)),  # a gap of noise around 0
        "layer_mean": torch.tensor(correct + rng.normal(0.02, 0.05, 200)),
    }
    counts = bootstrap_counts(200, seed=1)
    got = gap_retention(nll, "layer_mean", counts)
    w = counts.numpy().astype(float) / 200
    lo, hi = np.percentile(w @ nll["global_mean"].numpy() - w @ correct, [2.5, 97.5])
    assert lo < 0 < hi  # the test's premise: the denominator's interval holds 0
    assert got["resolved"] is False and got["value"] is None and got["ci95"] == [None, None]
    assert got["denominator"]["ci95"] == pytest.approx([lo, hi], rel=1e-10)  # both ends still reported


def test_gap_retention_endpoints():
    nll = windows()
    counts = bootstrap_counts(200, seed=0)
    full = gap_retention({**nll, "layer_mean": nll["correct"]}, "layer_mean", counts)
    none = gap_retention({**nll, "layer_mean": nll["global_mean"]}, "layer_mean", counts)
    assert full["value"] == pytest.approx(1.0) and full["ci95"] == pytest.approx([1.0, 1.0])
    assert none["value"] == pytest.approx(0.0) and none["ci95"] == pytest.approx([0.0, 0.0])
    no_gap = gap_retention({**nll, "global_mean": nll["correct"]}, "layer_mean", counts)
    assert (no_gap["value"], no_gap["ci95"], no_gap["resolved"]) == (None, [None, None], False)
    assert no_gap["denominator"] == {"value": 0.0, "ci95": [0.0, 0.0]}
