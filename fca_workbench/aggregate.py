"""``fca audit-many``: audit independently trained seeds and report every figure as mean ± sd."""

import json
import statistics
from pathlib import Path

from .audit import check_audit_out, run_audit
from .data import write_atomic
from .distributed import SINGLE
from .errors import UserError
from .outputs import output_folder, refuse_foreign

SCHEMA = "fca-audit-many/1"

HEADLINE = (
    ("NLL correct", "conditions.correct.nll"),
    ("ΔNLL cross_input", "conditions.cross_input.delta"),
    ("ΔNLL token_shuffle", "conditions.token_shuffle.delta"),
    ("ΔNLL global_mean", "conditions.global_mean.delta"),
    ("ΔNLL layer_mean", "conditions.layer_mean.delta"),
    ("retention layer_mean", "retention.layer_mean.value"),
    ("retention layer_scalar", "retention.layer_scalar.value"),
    ("retention layer_position_mean", "retention.layer_position_mean.value"),
    ("R² layer", "variance.r2_layer"),
    ("R² layer×slot", "variance.r2_layer_slot"),
    ("within-layer std", "variation.within_std"),
    ("fraction executed", "execution.fraction_executed"),
    ("latency / Dense", "execution.latency_ratio_vs_dense"),
)


def numeric_leaves(tree, prefix: str = "") -> dict[str, float]:
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
    """mean, sd (sample, n-1) and the per-seed values of every figure all audits share."""
    figures = [{k: a[k] for k in ("conditions", "retention", "variance", "variation", "execution") if a.get(k)}
               | ({"per_layer": per_layer_tree(a["per_layer"])} if a.get("per_layer") else {}) for a in audits]
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


def audit_names(checkpoints) -> list[str]:
    """One distinct folder name per checkpoint for its audit: the checkpoint's folder name, prefixed by
    its parent's where two share it (``a/fg``, ``b/fg`` -> ``a-fg``, ``b-fg``), numbered if still equal."""
    paths = [Path(c).resolve() for c in checkpoints]
    repeated = sorted({str(p) for p in paths if paths.count(p) > 1})
    if repeated:
        raise UserError(f"checkpoint {repeated[0]} is given twice; each seed is one checkpoint")
    names = [p.name for p in paths]
    names = [f"{p.parent.name}-{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{i}-{name}" for i, name in enumerate(names, 1)]
    return names


def aggregate_audits(settings_list, out, ranks=SINGLE, lock_wait: float = 0.0) -> dict | None:
    """Audit every checkpoint into ``out/<name>`` (``audit_names``), then ``out/audit_many.json``; every
    output folder is checked before the first audit starts. Under torchrun (``ranks``) every audit is
    distributed and rank 0 alone writes the summary and returns it (the other ranks return None)."""
    out = output_folder(out)
    refuse_foreign(out / "audit_many.json", SCHEMA)
    names = audit_names([settings.checkpoint for settings in settings_list])
    for name in names:
        check_audit_out(out / name)
    audits = [run_audit(settings, out / name, ranks, lock_wait) for settings, name in zip(settings_list, names)]
    if not ranks.lead:
        return None
    summary = {
        "schema": SCHEMA,
        "checkpoints": [a["model"]["path"] for a in audits],
        "audits": names,
        "archs": [a["model"]["arch"] for a in audits],
        "figures": summarise(audits),
    }
    write_atomic(out / "audit_many.json", (json.dumps(summary, indent=2) + "\n").encode())
    return summary


def format_aggregate(summary: dict) -> str:
    figures = summary["figures"]
    lines = [f"{len(summary['checkpoints'])} models ({', '.join(sorted(set(summary['archs'])))}): mean ± sd over seeds", ""]
    for label, path in HEADLINE:
        if path in figures:
            f = figures[path]
            pct = path.startswith("retention") or path.startswith("variance")
            value = f"{f['mean']:.2%} ± {f['sd']:.2%}" if pct else f"{f['mean']:.4f} ± {f['sd']:.4f}"
            lines.append(f"{label:32s} {value}")
    return "\n".join(lines)
