"""``downstream.json`` files as one table (``results.tables``): what notebook 08 and the dashboard show."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fca_workbench.downstream.gaps import GAP_Z, resolved
from fca_workbench.foundation.checkpoint import recorded_name
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported when a table is built
    import pandas as pd

DOWNSTREAM_TABLE = [
    Column("model", "model", "text"),
    Column("task", "task", "text"),
    Column("condition", "condition", "text"),
    Column("metric", "metric", "text"),
    Column("value", "value"),
    Column("stderr", "stderr (lm-eval)"),
    Column(
        "retention",
        "retention of the correct → global_mean gap (n/a: the gap is within 1.96 of its standard error)",
        "pct",
    ),
]


def downstream_table(downstreams: list[dict]) -> pd.DataFrame:
    """One row per model, task, condition and metric of ``fca eval`` results (``downstream.json`` dicts)."""
    rows = [
        {"model": recorded_name(d["model"]), "task": task, "condition": condition, "metric": metric, **figure}
        for d in downstreams
        for task, entry in d["tasks"].items()
        for condition, metrics in entry["conditions"].items()
        for metric, figure in metrics.items()
    ]
    return make_table(
        "downstream",
        "Downstream tasks (fca eval, lm-evaluation-harness) under static conditions: value ± lm-eval's stderr, and "
        "the share of the correct → global_mean gap each condition keeps",
        DOWNSTREAM_TABLE,
        rows,
    )


GAP_TABLE = [
    Column("model", "model", "text"),
    Column("task", "task", "text"),
    Column("metric", "metric", "text"),
    Column("gap", "correct − global_mean", "delta"),
    Column("stderr", "its stderr"),
    Column("over", "stderr over", "text"),
    Column("resolved", f"a gap (beyond {GAP_Z} stderr)", "text"),
]


def gap_table(downstreams: list[dict]) -> pd.DataFrame:
    """One row per model, task and metric: the gap every retention in ``downstream_table`` is a share of, and
    whether it is one (``downstream.json`` files written before ``gaps`` existed give no rows)."""
    rows = [
        {
            "model": recorded_name(d["model"]),
            "task": task,
            "metric": metric,
            "gap": g["value"],
            "stderr": g["stderr"],
            "over": "paired documents" if g["paired"] else "two independent stderrs",
            "resolved": "yes" if resolved(g) else "no",
        }
        for d in downstreams
        for task, entry in d["tasks"].items()
        for metric, g in entry.get("gaps", {}).items()
    ]
    return make_table(
        "downstream_gaps",
        "Downstream tasks: the correct → global_mean gap of each metric, its standard error (paired over the "
        "documents both conditions answer where lm-eval logs them) and whether it is beyond its noise",
        GAP_TABLE,
        rows,
    )
