"""Gap retention as tables: every retention with both ends (the gap it divides by, the reference it is over) and
its 95% CI, per model and over seeds (docs/concepts.md#figures).

A retention whose gap does not resolve (its denominator's 95% CI holds 0) is no figure: its cell is empty, never
a percentage, and the gap beside it says why. Over seeds a retention is a ratio of means (``results.inference``),
not a mean of per-seed ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fca_workbench.results.audit_tables import by_configuration, model_name, with_controller
from fca_workbench.results.conditions import LOW, RETAINED, RETENTION_PROFILES
from fca_workbench.results.inference import retention_over_seeds
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd


def reference_of(retention: dict) -> str:
    """The condition at a retention's low end (``global_mean`` for an audit that predates the field)."""
    return retention.get("reference", LOW)


def retention_table(audits: list[dict], profiles: Sequence[str] = RETENTION_PROFILES) -> pd.DataFrame:
    """Gap retention of each static profile with its 95% CI, the reference it is over and that reference's gap
    over ``correct`` (nats, paired 95% CI), one row per model: ``profiles``, those every audit with a controller
    has by default (one audit's view passes all of its own). An unresolved retention is empty."""
    columns = [Column("model", "model", "text"), Column("arch", "arch", "text")]
    for p in profiles:
        columns += [
            Column(p, p, "pct", digits=4),
            Column(f"{p}_ci95", f"{p} 95% CI", "pct", "ci", digits=4),
            Column(f"{p}_reference", f"{p} reference", "text"),
            Column(f"{p}_gap", f"{p} gap (nats)", "delta"),
            Column(f"{p}_gap_ci95", f"{p} gap 95% CI", "delta", "ci"),
        ]
    rows = []
    for a in with_controller(audits):
        row = {"model": model_name(a), "arch": a["model"]["arch"]}
        for p in profiles:
            r = a["retention"][p]
            gap = r.get("denominator") or {}
            row[p], row[f"{p}_ci95"] = r["value"], r["ci95"]
            row[f"{p}_reference"], row[f"{p}_gap"] = reference_of(r), gap.get("value")
            row[f"{p}_gap_ci95"] = gap.get("ci95")
        rows.append(row)
    return make_table(
        "retention_per_model",
        "Static profiles: share of the gap between each profile's reference and correct retained, per model "
        "(empty: the gap does not resolve)",
        columns,
        rows,
    )


def retention_seed_table(audits: list[dict]) -> pd.DataFrame:
    """Gap retention of each static profile over seeds, per configuration (``by_configuration``): the ratio of the mean numerator to the
    mean denominator with its bootstrap 95% CI over seeds (``inference.retention_over_seeds``)."""
    columns = [Column("arch", "arch", "text"), Column("n", "seeds", "int")]
    for p in RETENTION_PROFILES:
        columns += [Column(p, p, "pct", digits=4), Column(f"{p}_ci95", f"{p} 95% CI", "pct", "ci", digits=4)]
    rows = []
    for arch, group in by_configuration(with_controller(audits)).items():
        row: dict = {"arch": arch, "n": len(group)}
        for p in RETENTION_PROFILES:
            figure = retention_over_seeds([a["retention"][p] for a in group])
            row[p], row[f"{p}_ci95"] = figure["value"], figure["ci95"]
        rows.append(row)
    return make_table(
        "retention_over_seeds",
        "Static profiles: gap retention over the seeds of one configuration (ratio of means, bootstrap 95% CI over seeds)",
        columns,
        rows,
    )


def retention_points(audits: list[dict]) -> pd.DataFrame:
    """What the retention figure plots, one row per configuration and profile whose retention resolves (a router's
    ``layer_mean_topk`` too): the value (one seed's, or the ratio of means over seeds) and its 95% CI (one seed:
    the audit's; several: the bootstrap over seeds), under a label that says how many seeds the point has."""
    import pandas as pd

    rows = []
    for arch, group in by_configuration(with_controller(audits)).items():
        for p in RETAINED:
            if not all(p in a["retention"] for a in group):
                continue
            figure = retention_over_seeds([a["retention"][p] for a in group])
            low, high = figure["ci95"]
            if figure["value"] is None or low is None or high is None:
                continue
            rows.append(
                {
                    "arch": f"{arch} (n={len(group)})",
                    "profile": p,
                    "reference": reference_of(group[0]["retention"][p]),
                    "value": figure["value"],
                    "error_minus": figure["value"] - low,
                    "error_plus": high - figure["value"],
                    "error": f"95% CI over {len(group)} seeds" if len(group) > 1 else "95% CI",
                }
            )
    return pd.DataFrame(rows)
