"""The correct → global_mean gap of a downstream metric, its standard error, and the share of it a static
condition keeps: the arithmetic of ``fca eval``'s retention, without lm-eval (tables and notebooks read it)."""

from __future__ import annotations

import math
import statistics

GAP_Z = 1.96  # the correct-to-global_mean gap must exceed this many of its standard errors to be a gap


def gap(top: dict, low: dict) -> dict:
    """``correct`` − ``global_mean`` of one metric (each: value, stderr, its ``documents``) and the gap's
    standard error: paired over the documents (the differences' sample sd / √n, as lm-eval gives a mean's
    stderr) where both conditions have a number for each of the same documents and the metric is their mean;
    else the two stderrs combined as if independent (conservative for paired documents)."""
    value = top["value"] - low["value"]
    a, b = top.get("documents") or {}, low.get("documents") or {}
    differences = [a[d] - b[d] for d in a if a[d] is not None and b.get(d) is not None]
    paired = (
        len(differences) > 1
        and len(differences) == len(a) == len(b)
        and all(math.isclose(statistics.fmean(v.values()), f["value"], abs_tol=1e-9) for v, f in ((a, top), (b, low)))
    )
    if paired:
        stderr: float | None = statistics.stdev(differences) / math.sqrt(len(differences))
    elif top.get("stderr") is None and low.get("stderr") is None:
        stderr = None
    else:
        stderr = math.hypot(top.get("stderr") or 0.0, low.get("stderr") or 0.0)
    return {"value": value, "stderr": stderr, "paired": paired}


def resolved(spread: dict) -> bool:
    """Whether a ``gap`` is one: positive and beyond ``GAP_Z`` of its standard errors."""
    return spread["value"] > 0 and spread["value"] > GAP_Z * (spread["stderr"] or 0.0)


def retention(value: float, correct: dict, global_mean: dict, spread: dict | None = None) -> float | None:
    """The share of the ``correct``-to-``global_mean`` gap a condition keeps; None unless the live model beats
    ``global_mean`` by more than ``GAP_Z`` standard errors of the gap (``spread``: ``gap`` of the two), since a
    ratio over a gap that may be noise is no figure."""
    spread = spread or gap(correct, global_mean)
    if not resolved(spread):
        return None
    return (value - global_mean["value"]) / spread["value"] + 0.0  # + 0.0: no -0.0 at the low end
