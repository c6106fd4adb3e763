"""Seed-level inference (``results.inference``) against SciPy and hand-computed answers."""

import math

import numpy as np
import pytest

from fca_workbench.results import inference

stats = pytest.importorskip("scipy.stats")  # in the test environment through lm-eval


@pytest.mark.parametrize("df", [1.5, 2.3, 4.0, 10.0, 57.0])
def test_the_t_distribution_is_scipys(df):
    for t in (0.05, 0.7, 2.1, 6.0):
        assert inference.t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9, abs=1e-14)
    assert inference.t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_welch_is_scipys(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.0, 1.0, 5), rng.normal(0.8, 2.0, 8)
    got = inference.welch(list(a), list(b))
    expected = stats.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(expected.statistic, rel=1e-12)
    assert got["p"] == pytest.approx(expected.pvalue, rel=1e-9)
    assert got["df"] == pytest.approx(expected.df, rel=1e-12)
    assert got["ci95"] == pytest.approx(list(expected.confidence_interval(0.95)), rel=1e-8)


def test_the_exact_permutation_test_is_scipys_and_cannot_go_below_0_1_at_3_vs_3():
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.0, 1.0, 4), rng.normal(1.0, 1.0, 5)
    expected = stats.permutation_test(
        (a, b), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent", n_resamples=np.inf
    ).pvalue
    assert inference.permutation_p(list(a), list(b)) == pytest.approx(expected, rel=1e-12)
    # 3 vs 3, perfectly separated: 2 of the 20 relabellings are as extreme
    assert inference.permutation_p([1, 2, 3], [10, 11, 12]) == pytest.approx(0.1)
    assert inference.smallest_permutation_p(3, 3) == pytest.approx(0.1)
    assert inference.smallest_permutation_p(8, 8) == pytest.approx(2 / math.comb(16, 8))


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04, 0.5 -> 4 * 0.01, 3 * 0.03, max(2 * 0.04, 0.09), max(0.5, 0.09)
    assert inference.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert inference.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 × 0.8, capped at 1
    found = inference.holm_contrasts({"x": {"p": 0.01}, "y": {"p": 0.06}})
    assert found["x"]["finding"] and not found["y"]["finding"] and found["x"]["holm_p"] == pytest.approx(0.02)


def test_hedges_g_by_hand():
    a, b = [1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0]
    pooled = math.sqrt((3 * np.var(a, ddof=1) + 3 * np.var(b, ddof=1)) / 6)
    g = (1 - 3 / (4 * 8 - 9)) * (-2.0) / pooled
    got = inference.hedges_g(a, b)
    assert got["value"] == pytest.approx(g)
    se = math.sqrt(8 / 16 + g * g / 16)
    assert got["ci95"] == pytest.approx([g - 1.959964 * se, g + 1.959964 * se])


def test_a_ratio_over_seeds_is_a_ratio_of_means_not_a_mean_of_ratios():
    numerators, denominators = [0.1, 0.9, 0.5], [0.2, 1.0, 0.6]
    got = inference.ratio_of_means(numerators, denominators, resamples=4000, seed=0)
    assert got["value"] == pytest.approx(1.5 / 1.8)
    assert got["value"] != pytest.approx(np.mean(np.divide(numerators, denominators)))
    rng = np.random.default_rng(0)  # the same draws, by hand
    picks = rng.integers(3, size=(4000, 3))
    ratios = np.asarray(numerators)[picks].mean(1) / np.asarray(denominators)[picks].mean(1)
    assert got["ci95"] == pytest.approx(list(np.percentile(ratios, [2.5, 97.5])))
    assert got["resolved"]


def test_a_ratio_over_seeds_with_windows_within_and_an_unresolved_one():
    rng = np.random.default_rng(1)
    within = [(rng.normal(0.5, 0.1, 30), rng.normal(1.0, 0.1, 30)) for _ in range(4)]
    got = inference.ratio_of_means([x.mean() for x, _ in within], [y.mean() for _, y in within], within, 300)
    assert got["value"] == pytest.approx(sum(x.mean() for x, _ in within) / sum(y.mean() for _, y in within))
    assert got["ci95"][0] < got["value"] < got["ci95"][1]
    noise = inference.ratio_of_means([0.1, -0.1, 0.05], [0.01, -0.02, 0.015])
    assert noise["resolved"] is False and noise["value"] is None and noise["ci95"] == [None, None]


def test_retention_over_seeds_reads_the_ends():
    seeds = [
        {"value": 0.5, "ci95": [0.4, 0.6], "numerator": {"value": 0.5}, "denominator": {"value": 1.0}},
        {"value": 0.25, "ci95": [0.2, 0.3], "numerator": {"value": 0.5}, "denominator": {"value": 2.0}},
    ]
    assert inference.retention_over_seeds(seeds)["value"] == pytest.approx(1.0 / 3.0)
    assert inference.retention_over_seeds(seeds[:1])["value"] == 0.5
    old = [{"value": 0.5, "ci95": [0.4, 0.6]}] * 2
    assert inference.retention_over_seeds(old)["value"] is None
