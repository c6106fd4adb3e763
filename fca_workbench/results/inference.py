"""Inference over seeds (docs/concepts.md#over-seeds): the unit is the trained model.

A ratio over seeds is a ratio of means with a bootstrap over seeds (and over windows within each seed, where the
per-window values are there), never a mean of per-seed ratios; a difference between two designs is one test per
contrast (Welch's t on per-seed values, or an exact permutation test), its effect size with an interval, and a Holm
correction over the contrasts made. Pure Python and NumPy: no SciPy (the Student t distribution is computed here,
checked against SciPy in the tests).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

import numpy as np

LEVEL = 0.05  # the level a contrast is judged at, after the Holm correction
RESAMPLES = 2000


# -- the Student t distribution ----------------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""

    def guarded(value: float) -> float:
        return value if abs(value) > 1e-300 else 1e-300

    c, d = 1.0, 1.0 / guarded(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 1000):
        for coefficient in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 / guarded(1.0 + coefficient * d)
            c = guarded(1.0 + coefficient / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t, by bisection of the two-sided tail."""
    tail, low, high = 2.0 * (1.0 - p), 0.0, 1e6
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (middle, high) if t_two_sided_p(middle, df) > tail else (low, middle)
    return (low + high) / 2.0


# -- a contrast between two designs -------------------------------------------------------------------------------


def welch(a: Sequence[float], b: Sequence[float]) -> dict:
    """Welch's t test of mean(a) − mean(b): ``difference`` with its 95% CI (Welch–Satterthwaite df), ``t``,
    ``df`` and the two-sided ``p``. Each side needs two values or more."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's t needs at least two values on each side")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        p = 1.0 if difference == 0 else 0.0
        return {"difference": difference, "ci95": [difference, difference], "t": None, "df": None, "p": p}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = difference / se
    half = t_quantile(0.975, df) * se
    return {"difference": difference, "ci95": [difference - half, difference + half], "t": t, "df": df,
            "p": t_two_sided_p(t, df)}  # fmt: skip


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The exact two-sided permutation p of mean(a) − mean(b): the share of all relabellings of the pooled values
    into groups of len(a) and len(b) whose |difference| is at least the observed one."""
    pooled, n = [*a, *b], len(a)
    total = sum(pooled)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    hits = count = 0
    for chosen in itertools.combinations(range(len(pooled)), n):
        first = sum(pooled[i] for i in chosen)
        difference = abs(first / n - (total - first) / (len(pooled) - n))
        hits += difference >= observed - 1e-12 * max(1.0, observed)
        count += 1
    return hits / count


def smallest_permutation_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p an exact permutation test of ``n_a`` vs ``n_b`` values can reach (two relabellings,
    the observed one and its mirror, are as extreme when the groups are the same size)."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given (each at most 1, never below an earlier one's)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def hedges_g(a: Sequence[float], b: Sequence[float]) -> dict:
    """Hedges' g (the standardized mean difference with the small-sample correction) and its approximate 95% CI
    (normal, Hedges & Olkin's variance)."""
    na, nb = len(a), len(b)
    pooled = math.sqrt(((na - 1) * statistics.variance(a) + (nb - 1) * statistics.variance(b)) / (na + nb - 2))
    difference = statistics.fmean(a) - statistics.fmean(b)
    if pooled == 0:
        return {"value": None, "ci95": [None, None]}
    g = (1 - 3 / (4 * (na + nb) - 9)) * difference / pooled
    se = math.sqrt((na + nb) / (na * nb) + g * g / (2 * (na + nb)))
    return {"value": g, "ci95": [g - 1.959964 * se, g + 1.959964 * se]}


def contrast(a: Sequence[float], b: Sequence[float]) -> dict:
    """One design (``a``) against another (``b``), per-seed values: Welch's test and effect, the exact
    permutation p and the smallest p it could reach, Hedges' g with its CI."""
    return {
        **welch(a, b),
        "permutation_p": permutation_p(a, b),
        "smallest_permutation_p": smallest_permutation_p(len(a), len(b)),
        "hedges_g": hedges_g(a, b),
        "n": [len(a), len(b)],
    }


def holm_contrasts(contrasts: dict[str, dict], key: str = "p") -> dict[str, dict]:
    """``contrasts`` (by name) with ``holm_p`` (Holm over all of them, on ``key``) and ``finding`` (holm_p below
    ``LEVEL``) added."""
    names = list(contrasts)
    adjusted = holm([contrasts[n][key] for n in names])
    return {n: {**contrasts[n], "holm_p": p, "finding": p < LEVEL} for n, p in zip(names, adjusted)}


# -- a ratio over seeds -------------------------------------------------------------------------------------------


def ratio_of_means(
    numerators: Sequence[float],
    denominators: Sequence[float],
    within: Sequence[tuple[Sequence[float], Sequence[float]]] | None = None,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict:
    """mean(numerators) / mean(denominators) over seeds, with a percentile 95% CI from a bootstrap over seeds; with
    ``within`` (per seed, its per-window numerators and denominators) a two-level bootstrap: seeds, then windows
    within each seed drawn. ``resolved``: the denominator's CI excludes 0 (else value and CI are None)."""
    n = len(numerators)
    if n == 0 or len(denominators) != n:
        raise ValueError("a ratio of means needs as many numerators as denominators, at least one")
    rng = np.random.default_rng(seed)
    picks = rng.integers(n, size=(resamples, n))
    if within is None:
        num = np.asarray(numerators, dtype=float)[picks].mean(axis=1)
        den = np.asarray(denominators, dtype=float)[picks].mean(axis=1)
    else:
        per_seed = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float)) for x, y in within]
        num, den = np.zeros(resamples), np.zeros(resamples)
        for r in range(resamples):
            for s in picks[r]:
                x, y = per_seed[s]
                windows = rng.integers(len(x), size=len(x))
                num[r] += x[windows].mean() / n
                den[r] += y[windows].mean() / n
    den_ci = [float(v) for v in np.percentile(den, [2.5, 97.5])]
    mean_den = statistics.fmean(denominators)
    resolved = mean_den != 0 and (den_ci[0] > 0 or den_ci[1] < 0)
    figure: dict = {"value": None, "ci95": [None, None], "resolved": bool(resolved), "n": n}
    figure["numerator"] = statistics.fmean(numerators)
    figure["denominator"] = {"value": mean_den, "ci95": den_ci}
    if resolved:
        figure["value"] = statistics.fmean(numerators) / mean_den
        figure["ci95"] = [float(v) for v in np.percentile(num / den, [2.5, 97.5])]
    return figure


def retention_over_seeds(retentions: list[dict]) -> dict:
    """One profile's retention over seeds from each seed's ``audit.json`` retention: one seed, its own (the
    bootstrap over its windows); several, the ratio of the mean numerator to the mean denominator with a bootstrap
    over seeds. Unresolved (value None) where any seed lacks its ends (an audit that predates them) or the
    denominator's CI holds 0."""
    if len(retentions) == 1:
        return {**retentions[0], "n": 1}
    if not all("denominator" in r and "numerator" in r for r in retentions):
        return {"value": None, "ci95": [None, None], "resolved": False, "n": len(retentions)}
    numerators = [r["numerator"]["value"] for r in retentions]
    denominators = [r["denominator"]["value"] for r in retentions]
    return ratio_of_means(numerators, denominators)
