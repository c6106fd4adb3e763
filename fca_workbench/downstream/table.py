"""``downstream.json`` files as tables (``results.tables``) and as printed text: what ``fca eval`` prints and
notebook 08 and the dashboard show."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fca_workbench.downstream.gaps import resolved
from fca_workbench.foundation.checkpoint import recorded_name
from fca_workbench.results.frames import downstream_row
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported when a table is built
    import pandas as pd

DOWNSTREAM_TABLE = [
    Column("model", "model", "text"),
    Column("task", "task", "text"),
    Column("condition", "condition", "text"),
    Column("metric", "metric", "text"),
    Column("value", "value"),
    Column("stderr", "stderr (lm-eval: items independent)"),
    Column("retention", "retention (unresolved: its gap's 95% CI reaches 0)", "pct"),
    Column("retention_ci95", "retention 95% CI (clustered, delta method)", "pct", "ci"),
    Column("reference", "retention reference (its gap's low end)", "text"),
    Column("numerator", "numerator: condition − reference", "delta"),
    Column("denominator", "denominator: correct − reference", "delta"),
]


def downstream_table(downstreams: list[dict]) -> pd.DataFrame:
    """One row per model, task, condition and metric of ``fca eval`` results (``downstream.json`` dicts)."""
    rows = [
        {
            "model": recorded_name(d["model"]),
            "task": task,
            "condition": condition,
            "metric": metric,
            **table_row(f),
        }
        for d in downstreams
        for task, entry in d["tasks"].items()
        for condition, metrics in entry["conditions"].items()
        for metric, f in metrics.items()
    ]
    return make_table(
        "downstream",
        "Downstream tasks (fca eval, lm-evaluation-harness) under static conditions: value ± lm-eval's stderr, and "
        "the share of the correct → reference gap each static profile keeps (reference: the condition's own, "
        "random_topk for a router's top-k profile where it was evaluated, else global_mean), with its 95% CI "
        "clustered by play",
        DOWNSTREAM_TABLE,
        rows,
    )


def table_row(figure: dict) -> dict:
    """``downstream_row`` with the retention's interval as one ``ci`` column's ``[lo, hi]``."""
    row = downstream_row(figure)
    return row | {"retention_ci95": [row["retention_ci95_lo"], row["retention_ci95_hi"]]}


GAP_TABLE = [
    Column("model", "model", "text"),
    Column("task", "task", "text"),
    Column("condition", "condition", "text"),
    Column("metric", "metric", "text"),
    Column("gap", "correct − condition", "delta"),
    Column("stderr", "its stderr (clustered)"),
    Column("ci95", "95% CI (t, G − 1 df)", "delta", "ci"),
    Column("clusters", "clusters G", "int"),
    Column("over", "stderr over", "text"),
    Column("resolved", "a gap (95% CI above 0)", "text"),
]


def gap_table(downstreams: list[dict]) -> pd.DataFrame:
    """One row per model, task, condition (but ``correct``) and metric: its gap against ``correct``, the gap's
    clustered standard error and interval, the number of clusters and whether it resolves."""
    rows = [
        {
            "model": recorded_name(d["model"]),
            "task": task,
            "condition": condition,
            "metric": metric,
            "gap": g["value"],
            "stderr": g["stderr"],
            "ci95": g["ci95"],
            "clusters": g["clusters"],
            "over": over(g, entry["clusters"]),
            "resolved": "yes" if resolved(g) else "no",
        }
        for d in downstreams
        for task, entry in d["tasks"].items()
        for condition, metrics in entry["conditions"].items()
        for metric, f in metrics.items()
        if (g := f["gap"]) is not None
    ]
    return make_table(
        "downstream_gaps",
        "Downstream tasks: each condition's gap against correct over the same documents, its standard error "
        "clustered by play (CR1) with a t interval on G − 1 degrees of freedom, and whether it resolves (with 4 "
        "plays the clustered error is itself uncertain: t(3) = 3.18)",
        GAP_TABLE,
        rows,
    )


def over(g: dict, clusters: dict) -> str:
    """What a gap's standard error is over, in words."""
    if not g["paired"]:
        return "two independent stderrs (unpaired)"
    if clusters["field"] is None:
        return "paired documents"
    return f"paired documents, clustered by {clusters['field']}"


def format_downstream(downstream: dict) -> str:
    """The printed table: per task, condition and metric, the value ± lm-eval's stderr, the gap against ``correct``
    with its clustered interval, and the retention with its interval and reference (or ``unresolved``)."""
    model, hub = downstream["model"], downstream["model"].get("hub")
    source = f"{hub['id']} at commit {hub['commit']}" if hub else model["path"]
    lines = [f"{source} ({model['arch']}), lm-eval {downstream['settings']['lm_eval']}"]
    for task, entry in downstream["tasks"].items():
        lines.append(f"\n{task} ({entry['samples']} documents, {clusters_text(entry['clusters'])})")
        lines.append(f"  {'condition':20s} {'metric':8s} value ± stderr      gap vs correct [95% CI]      retention")
        for condition, metrics in entry["conditions"].items():
            for metric, f in metrics.items():
                stderr = "" if f["stderr"] is None else f" ± {f['stderr']:.4f}"
                shown = f"{f['value']:.4f}{stderr}"
                lines.append(f"  {condition:20s} {metric:8s} {shown:18s} {gap_text(f['gap']):28s} {kept_text(f)}")
    return "\n".join(lines)


def clusters_text(clusters: dict) -> str:
    """``4 clusters by play``, or ``each document its own cluster``."""
    if clusters["field"] is None:
        return "each document its own cluster"
    count = clusters["count"]
    return f"{count} cluster{'' if count == 1 else 's'} by {clusters['field']}"


def gap_text(g: dict | None) -> str:
    """A gap as printed: value and interval, ``unpaired`` where it is not over the same documents."""
    if g is None:
        return ""
    lo, hi = g["ci95"]
    ci = "[no interval]" if lo is None else f"[{lo:+.4f}, {hi:+.4f}]"
    return f"{g['value']:+.4f} {ci}" + ("" if g["paired"] else " unpaired")


def kept_text(f: dict) -> str:
    """A retention as printed: a percentage with its interval and reference, or ``unresolved`` (no percentage); the
    retention against another reference (``global_mean`` beside a router's ``random_topk``) after it, named."""
    kept = f["retention"]
    if kept is None:
        return ""
    others = "".join(f"; {share_text(other)}" for other in kept.get("other_references", {}).values())
    return share_text(kept) + others


def share_text(kept: dict) -> str:
    """One retention: ``51.8% [38%, 65%] of the gap to random_topk``, or ``unresolved (...)``."""
    if not kept["resolved"]:
        return f"unresolved (the gap to {kept['reference']} does not resolve)"
    lo, hi = kept["ci95"]
    ci = "" if lo is None else f" [{100 * lo:.0f}%, {100 * hi:.0f}%]"
    return f"{100 * kept['value']:.1f}%{ci} of the gap to {kept['reference']}"
