"""Figures over independently trained seeds: every number several audits share, as mean ± sd, and each retention
as a ratio of means with its bootstrap CI over seeds (``inference.retention_over_seeds``)."""

import statistics

from fca_workbench.results.conditions import HEADLINE_CONDITIONS, RETENTION_PROFILES
from fca_workbench.results.inference import retention_over_seeds

HEADLINE = (
    ("NLL correct", "conditions.correct.nll"),
    *((f"ΔNLL {c}", f"conditions.{c}.delta") for c in HEADLINE_CONDITIONS),
    ("R² layer", "variance.r2_layer"),
    ("R² layer×slot", "variance.r2_layer_slot"),
    ("within-layer std", "variation.within_std"),
    ("fraction executed", "execution.fraction_executed"),
    ("latency / Dense", "execution.latency_ratio_vs_dense"),
)


def numeric_leaves(tree: dict, prefix: str = "") -> dict[str, float]:
    """Every scalar number in a nested audit dict, keyed by its dotted path (lists are left out)."""
    leaves = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            leaves.update(numeric_leaves(value, path + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            leaves[path] = float(value)
    return leaves


def per_layer_tree(rows: list[dict]) -> dict:
    """The per-layer sweep's rows as ``{layer: {condition: {"nll", "delta"}}}``, so its figures have dotted
    paths (``per_layer.3.cross_input.delta``) like every other figure."""
    tree: dict = {}
    for row in rows:
        tree.setdefault(str(row["layer"]), {})[row["condition"]] = {"nll": row["nll"], "delta": row["delta"]}
    return tree


def summarise(audits: list[dict]) -> dict[str, dict]:
    """mean, sd (sample, n-1) and the per-seed values of every figure all audits share (and, of the design
    studies' summaries, which read like audits, the card's ``eval_nll``, the router study's ``export_eval_nll``
    and the figures ``design_study`` derives from a summary)."""
    keys = ("conditions", "retention", "variance", "variation", "execution", "eval_nll", "export_eval_nll", "derived")
    figures = [
        {k: a[k] for k in keys if a.get(k)}
        | ({"per_layer": per_layer_tree(a["per_layer"])} if a.get("per_layer") else {})
        for a in audits
    ]
    leaves = [numeric_leaves(tree) for tree in figures]
    shared = sorted(set.intersection(*(set(l) for l in leaves)))
    return {
        path: {
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values,
        }
        for path in shared
        for values in [[l[path] for l in leaves]]
    }


def retention_summary(audits: list[dict]) -> dict[str, dict]:
    """Per retention profile every audit has: the ratio of means over the seeds (``retention_over_seeds``)."""
    shared = set.intersection(*(set(a.get("retention") or {}) for a in audits)) if audits else set()
    return {p: retention_over_seeds([a["retention"][p] for a in audits]) for p in RETENTION_PROFILES if p in shared}


def format_aggregate(summary: dict) -> str:
    figures = summary["figures"]
    lines = [
        f"{len(summary['checkpoints'])} models ({', '.join(sorted(set(summary['archs'])))}): mean ± sd over seeds",
        "",
    ]
    for label, path in HEADLINE:
        if path in figures:
            f = figures[path]
            pct = path.startswith("variance")
            value = f"{f['mean']:.2%} ± {f['sd']:.2%}" if pct else f"{f['mean']:.4f} ± {f['sd']:.4f}"
            lines.append(f"{label:32s} {value}")
    for profile, r in (summary.get("retention") or {}).items():
        lo, hi = r["ci95"]
        shown = "unresolved (its gap's 95% CI holds 0)" if r["value"] is None else f"{r['value']:.2%}"
        if r["value"] is not None and lo is not None and hi is not None:
            shown += f" [{lo:.2%}, {hi:.2%}] (ratio of means)"
        lines.append(f"{'retention ' + profile:32s} {shown}")
    return "\n".join(lines)
