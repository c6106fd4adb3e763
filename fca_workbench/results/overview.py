"""Every audit of a folder in one table: the dashboard's overview, ``load_audits(...).overview`` and its CSV.

One row per audit, read from its ``audit.json`` like every table of ``audit_tables.py``: the headline figures
(ΔNLL of each reassignment with its CI, the best static profile and its retention, R², what ran, latency
against the baseline) and the three verdicts in short form, for every model, with a controller or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fca_workbench.results.audit_tables import model_name
from fca_workbench.results.conditions import LIVE_RUN, REASSIGNMENTS, REFERENCE, RETAINED
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd

VERDICTS = (
    "coefficient_variation",
    "assignment_dependence",
    "staticness",
    "conditional_execution",
)  # audit.json verdicts
EXECUTED = ("fraction_executed", "expert_fraction_executed")  # the second for routers only

OVERVIEW_COLUMNS = [
    Column("audit", "audit", "text"),
    Column("model", "model", "text"),
    Column("arch", "arch", "text"),
    Column("params", "params", "int"),
    Column("eval_windows", "eval windows", "int"),
    Column("nll_correct", "NLL", "float"),
    *[
        column
        for name in REASSIGNMENTS
        for column in (
            Column(f"delta_{name}", f"ΔNLL {name}", "delta"),
            Column(f"delta_{name}_ci95", f"ΔNLL {name} 95% CI", "delta", "ci"),
        )
    ],
    Column("best_profile", "best static profile", "text"),
    Column("best_retention", "its retention", "pct", digits=4),
    Column("best_reference", "retention over", "text"),
    Column("r2_layer", "R² layer", "pct", digits=4),
    Column("r2_layer_slot", "R² layer×slot", "pct", digits=4),
    Column("fraction_executed", "fraction executed", "float"),
    Column("expert_fraction_executed", "expert fraction executed", "float"),
    Column("latency_ratio_vs_dense", "latency / baseline", "float", digits=3),
    *[Column(f"verdict_{key}", key.replace("_", " "), "text") for key in VERDICTS],
]


def short_verdict(sentence: str) -> str:
    """A verdict's lead (``verdicts.py`` opens each sentence with it): the words before its first ``:``, ``;``,
    `` (`` or ``.``."""
    cuts = [i for i in (sentence.find(mark) for mark in (":", ";", " (", ".")) if i > 0]
    return sentence[: min(cuts, default=len(sentence))]


def best_profile(audit: dict) -> tuple[str | None, float | None]:
    """The static profile that retains most of the gap between its reference and ``correct``, and its retention
    (None, None for a model without a controller, or whose every retention is unresolved: no percentage from a gap
    that does not resolve)."""
    retention = audit["retention"]
    retained = [(retention[p]["value"], p) for p in RETAINED if p in retention and retention[p]["value"] is not None]
    if not retained:
        return None, None
    value, profile = max(retained)
    return profile, value


def overview_row(audit: dict, name: str) -> dict:
    conditions, execution = audit["conditions"], audit["execution"]
    profile, retention = best_profile(audit)
    row = {
        "audit": name,
        "model": model_name(audit),
        "arch": audit["model"]["arch"],
        "params": audit["model"]["params"],
        "eval_windows": audit["data"]["eval"]["windows"],
        "nll_correct": (conditions.get(REFERENCE) or conditions[LIVE_RUN])["nll"],  # the same without controller
        "best_profile": profile,
        "best_retention": retention,
        "best_reference": None if profile is None else audit["retention"][profile].get("reference"),
        **{key: (audit["variance"] or {}).get(key) for key in ("r2_layer", "r2_layer_slot")},
        **{key: execution.get(key) for key in EXECUTED},
        "latency_ratio_vs_dense": execution["latency_ratio_vs_dense"],
        **{f"verdict_{key}": short_verdict(audit["verdict"].get(key) or "") for key in VERDICTS},  # none before
    }
    for condition in REASSIGNMENTS:
        figures = conditions.get(condition) or {}
        row[f"delta_{condition}"] = figures.get("delta")
        row[f"delta_{condition}_ci95"] = figures.get("delta_ci95")
    return row


def overview_table(audits: list[dict], names: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per audit; ``names`` (default: each audit's model) is how each is called in the ``audit`` column."""
    names = list(names) if names is not None else [model_name(a) for a in audits]
    rows = [overview_row(audit, name) for audit, name in zip(audits, names, strict=True)]
    return make_table(
        "overview",
        "Every audit: eval NLL (correct), headline figures (95% bootstrap CIs over windows), the verdicts in short",
        OVERVIEW_COLUMNS,
        rows,
    )
