"""Each condition's downstream gap against ``correct``, paired over the same documents with a standard error
clustered by the documents' source (``clustered``), and the retention of a static profile with both ends and its
interval: the arithmetic of ``fca eval``, without lm-eval (tables and notebooks read it).

A metric's figure under a condition is lm-eval's ``value`` and ``stderr`` with its ``documents`` (document id →
that document's value). The ``clusters`` of a task map each document id to its source (a play of the shipped
tasks); a task whose documents name none gives each document its own cluster, which makes the clustered error
lm-eval's paired one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable

from fca_workbench.downstream.clustered import clustered_mean, clustered_ratio

UNPAIRED_Z = 1.96  # two stderrs combined as if independent: a normal interval (no clusters to count)


def paired_documents(a: dict, b: dict) -> list | None:
    """The document ids both figures have a number for, when they are the same documents and each metric is the
    mean of its documents' values (so the difference of the means is the mean of the differences); else None."""
    da, db = a.get("documents") or {}, b.get("documents") or {}
    ids = [d for d in da if da[d] is not None and db.get(d) is not None]
    same = len(ids) > 1 and len(ids) == len(da) == len(db)
    if not same or not all(
        math.isclose(statistics.fmean(docs.values()), f["value"], abs_tol=1e-9) for docs, f in ((da, a), (db, b))
    ):
        return None
    return ids


def difference(a: dict, b: dict, clusters: dict[object, Hashable] | None) -> dict:
    """``a − b`` of one metric: paired over the documents with its clustered (CR1) standard error, the number of
    clusters and a t(G − 1) interval (``paired`` true); where the documents cannot be paired, the two stderrs
    combined as if independent (conservative for paired documents), a normal interval and no cluster count."""
    value = a["value"] - b["value"]
    ids = paired_documents(a, b)
    if ids is not None:
        da, db, of = a["documents"], b["documents"], clusters or {}
        figure = clustered_mean([da[d] - db[d] for d in ids], [of.get(d, ("document", d)) for d in ids])
        return {**figure, "value": value, "paired": True}  # the mean of the differences, exactly a − b
    stderrs = (a.get("stderr"), b.get("stderr"))
    stderr = None if stderrs == (None, None) else math.hypot(*(s or 0.0 for s in stderrs))
    ci = [None, None] if stderr is None else [value - UNPAIRED_Z * stderr, value + UNPAIRED_Z * stderr]
    return {"value": value, "stderr": stderr, "ci95": ci, "clusters": None, "df": None, "paired": False}


def gap(correct: dict, other: dict, clusters: dict[object, Hashable] | None = None) -> dict:
    """``correct`` − ``other``: what a condition costs (positive: it scores lower than the live model)."""
    return difference(correct, other, clusters)


def resolved(spread: dict) -> bool:
    """Whether a gap is one: positive, with its whole 95% interval above 0 (t(G − 1) · its clustered stderr; no
    stderr, or a single cluster, resolves nothing)."""
    low = spread["ci95"][0]
    return spread["value"] > 0 and low is not None and low > 0


def retention(
    profile: dict, correct: dict, reference: dict, name: str, clusters: dict[object, Hashable] | None = None
) -> dict:
    """The share of the ``correct`` → ``reference`` gap ``profile`` keeps, with both ends: ``numerator`` = profile −
    reference, ``denominator`` = correct − reference (each a paired ``difference``), ``reference`` its condition's
    name. ``value`` = numerator / denominator, with a delta-method CR1 interval on t(G − 1) over the same documents.
    A denominator that does not resolve gives ``resolved`` false, ``value`` None and no interval: a ratio over a gap
    that may be noise is no figure. Unpaired ends give the value without an interval."""
    numerator, denominator = difference(profile, reference, clusters), difference(correct, reference, clusters)
    entry: dict = {"value": None, "ci95": [None, None], "resolved": resolved(denominator), "reference": name}
    entry |= {"numerator": numerator, "denominator": denominator}
    if not entry["resolved"]:
        return entry
    ids = paired_documents(profile, reference) if numerator["paired"] and denominator["paired"] else None
    if ids is None:
        return entry | {"value": numerator["value"] / denominator["value"] + 0.0}
    of, dp, dc, dr = clusters or {}, profile["documents"], correct["documents"], reference["documents"]
    ratio = clustered_ratio(
        [dp[d] - dr[d] for d in ids], [dc[d] - dr[d] for d in ids], [of.get(d, ("document", d)) for d in ids]
    )
    return entry | {"value": numerator["value"] / denominator["value"] + 0.0, "ci95": ratio["ci95"]}
