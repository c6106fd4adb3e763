"""A mean over documents, and a ratio of two such means, with a standard error clustered by the documents' source.

The shipped tasks draw every item from one of four plays, and items of one play share their text, its words and
its characters: they are not independent, so lm-eval's standard error (sd / √n, items assumed independent) is too
small when the model's advantage differs by play. Here the unit of the error is the cluster (a play), not the item.

The choice, and why: a **cluster-robust (CR1) standard error with a Student t interval on G − 1 degrees of
freedom**, not a cluster bootstrap. With the G = 4 plays of the shipped tasks a cluster bootstrap has only 35
distinct resamples (multisets of 4 out of 4), one in 64 of which is a single play repeated, and its percentile
interval is known to be too narrow with so few clusters; CR1 with t(G − 1) is the small-G recommendation
(Cameron & Miller 2015, "A practitioner's guide to cluster-robust inference", section VI). With G = 4, t(3) is
3.18, not 1.96: the interval says honestly how little four plays pin down, and G is reported beside every figure.

- Mean of d_i over N documents in G clusters: d̄ = Σ d_i / N; each cluster's residual sum e_g = Σ_{i∈g} (d_i − d̄);
  Var(d̄) = G / (G − 1) · Σ_g e_g² / N². With one document per cluster this is exactly sd / √N (lm-eval's).
- Ratio R = Σ a_i / Σ b_i (a retention): the delta method, e_g = Σ_{i∈g} (a_i − R b_i);
  Var(R) = G / (G − 1) · Σ_g e_g² / (Σ b_i)².

Fewer than two clusters give no standard error (None): one play says nothing about the spread between plays.
Pure Python: tables and notebooks read it without lm-eval or torch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from fca_workbench.results.inference import t_quantile

LEVEL = 0.95  # every interval here is a two-sided 95% one


def cluster_sums(residuals: Sequence[float], clusters: Sequence[Hashable]) -> list[float]:
    """Per cluster (in order of first appearance), the sum of its documents' residuals."""
    sums: dict[Hashable, float] = {}
    for residual, cluster in zip(residuals, clusters, strict=True):
        sums[cluster] = sums.get(cluster, 0.0) + residual
    return list(sums.values())


def cr1_variance(residuals: Sequence[float], clusters: Sequence[Hashable], scale: float) -> float | None:
    """G / (G − 1) · Σ_g (Σ_{i∈g} residual_i)² / scale²; None with fewer than two clusters."""
    sums = cluster_sums(residuals, clusters)
    count = len(sums)
    if count < 2 or scale == 0:
        return None
    return count / (count - 1) * math.fsum(s * s for s in sums) / (scale * scale)


def critical(count: int | None) -> float | None:
    """The two-sided 95% critical value of Student's t with ``count − 1`` degrees of freedom (None below 2)."""
    if count is None or count < 2:
        return None
    return t_quantile(0.5 + LEVEL / 2, count - 1)


def interval(value: float, stderr: float | None, count: int | None) -> list[float | None]:
    """``value ± t(G − 1) · stderr``, or ``[None, None]`` without a standard error."""
    factor = critical(count)
    if stderr is None or factor is None:
        return [None, None]
    return [value - factor * stderr, value + factor * stderr]


def clustered_mean(values: Sequence[float], clusters: Sequence[Hashable]) -> dict:
    """The mean of ``values`` with its CR1 standard error over ``clusters`` (one label per value), the number of
    clusters G, the degrees of freedom G − 1 and the t interval."""
    if not values:
        raise ValueError("a clustered mean needs at least one value")
    mean = math.fsum(values) / len(values)
    count = len(set(clusters))
    variance = cr1_variance([v - mean for v in values], clusters, len(values))
    stderr = None if variance is None else math.sqrt(variance)
    return {
        "value": mean,
        "stderr": stderr,
        "ci95": interval(mean, stderr, count),
        "clusters": count,
        "df": count - 1 if count > 1 else None,
    }


def clustered_ratio(numerators: Sequence[float], denominators: Sequence[float], clusters: Sequence[Hashable]) -> dict:
    """Σ numerators / Σ denominators (the ratio of the two means over the same documents) with its delta-method CR1
    standard error and t interval; value None where the denominators sum to 0."""
    total = math.fsum(denominators)
    count = len(set(clusters))
    if total == 0:
        return {"value": None, "stderr": None, "ci95": [None, None], "clusters": count}
    ratio = math.fsum(numerators) / total
    residuals = [a - ratio * b for a, b in zip(numerators, denominators, strict=True)]
    variance = cr1_variance(residuals, clusters, total)
    stderr = None if variance is None else math.sqrt(variance)
    return {"value": ratio, "stderr": stderr, "ci95": interval(ratio, stderr, count), "clusters": count}
