"""Presentation helpers for the notebooks: audit dicts → pandas DataFrames, DataFrames → a Styler to read and
CSV / Markdown / LaTeX files, figures → interactive HTML.

Nothing here computes a figure of the audit: every value in a table is read from an ``audit.json`` (or
``aggregate.summarise`` of several), so a table always equals the audit it came from. A table is a DataFrame
of exact numbers (a 95% CI as ``<key>_lo`` / ``<key>_hi``, a mean ± sd over seeds as ``<key>_mean`` /
``<key>_sd`` / ``<key>_n``); its ``attrs`` carry its name, caption and column formats, which ``readable``
uses to show CIs as ``[lo, hi]``, shares as percentages and ΔNLL with its sign. The CSV keeps full
precision; Markdown and LaTeX are rounded for reading.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fca_workbench.foundation.checkpoint import recorded_name
from fca_workbench.results.conditions import (
    ALL_CONDITIONS,
    CONDITIONS,
    HEADLINE_CONDITIONS,
    LAYER_MEAN_TOPK,
    RETENTION_PROFILES,
)
from fca_workbench.results.report import nll_label
from fca_workbench.results.seeds import summarise
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd

AUDIT_CONDITIONS = ALL_CONDITIONS  # routing ones only where the audit has them (routers)


def model_name(audit: dict) -> str:
    return recorded_name(audit["model"])


def with_controller(audits: list[dict]) -> list[dict]:
    """The audits of models that have coefficients (Dense has none to vary or reassign)."""
    return [a for a in audits if a["variation"] is not None]


def by_configuration(audits: list[dict]) -> dict[str, list[dict]]:
    """The audits that are seeds of one configuration (``model.configuration``: the config and training settings
    less the seed), the only ones a figure may average. A group is labelled by its architecture, with its digest's
    first 8 hex digits where the audits hold several configurations of one architecture; an audit written without
    a digest stands alone, labelled by its model as well."""
    keyed: dict[tuple[str, str], list[dict]] = {}
    for audit in audits:
        model = audit["model"]
        digest = model.get("configuration") or f"{model_name(audit)} {model['fingerprint']}"
        keyed.setdefault((model["arch"], digest), []).append(audit)
    configurations = Counter(arch for arch, _ in keyed)
    return {_group_label(arch, digest, group, configurations[arch]): group for (arch, digest), group in keyed.items()}


def _group_label(arch: str, digest: str, group: list[dict], configurations: int) -> str:
    if configurations == 1:
        return arch
    if group[0]["model"].get("configuration"):
        return f"{arch} · config {digest[:8]}"
    return f"{arch} · {model_name(group[0])}"


def _dig(tree, path: str):
    for part in path.split("."):
        if tree is None:
            return None
        tree = tree.get(part)
    return tree


def seed_summary(audits: list[dict], paths: Iterable[str]) -> dict[str, dict | None]:
    """Mean ± sd (and n) over several audits of each dotted path, straight from ``aggregate.summarise``."""
    figures = summarise(audits)
    return {path: {**figures[path], "n": len(audits)} if path in figures else None for path in paths}


VARIANCE_COLUMNS = [
    Column("r2_layer", "R² layer", "pct", digits=4),
    Column("r2_layer_slot", "R² layer×slot", "pct", digits=4),
    Column("r2_layer_slot_position", "R² +position", "pct", digits=4),
    Column("r2_layer_slot_window", "R² +window", "pct", digits=4),
    Column("within_std", "within-(layer, slot) std", "float"),
    Column("cv", "CV", "float"),
]


VARIANCE_PATHS = {
    "r2_layer": "variance.r2_layer",
    "r2_layer_slot": "variance.r2_layer_slot",
    "r2_layer_slot_position": "variance.r2_layer_slot_position",
    "r2_layer_slot_window": "variance.r2_layer_slot_window",
    "within_std": "variation.within_std",
    "cv": "variation.cv",
}


def seed_rows(audits: list[dict], paths: dict[str, str]) -> list[dict]:
    """One row per configuration (``by_configuration``): the seed count and mean ± sd of each figure at ``paths`` (column -> audit path)."""
    rows = []
    for arch, group in by_configuration(audits).items():
        summary = seed_summary(group, paths.values())
        rows.append({"arch": arch, "n": len(group), **{k: summary[p] for k, p in paths.items()}})
    return rows


def variation_table(audits: list[dict]) -> pd.DataFrame:
    """Coefficient variation and variance decomposition, one row per model with a controller."""
    columns = [Column("model", "model", "text"), Column("arch", "arch", "text"), *VARIANCE_COLUMNS]
    rows = [
        {"model": model_name(a), "arch": a["model"]["arch"], **{k: _dig(a, p) for k, p in VARIANCE_PATHS.items()}}
        for a in with_controller(audits)
    ]
    return make_table(
        "variation_per_model", "Coefficient variation and variance decomposition (eval set), per model", columns, rows
    )


def variation_seed_table(audits: list[dict]) -> pd.DataFrame:
    """The same figures as mean ± sd over the seeds of each configuration (``by_configuration``)."""
    columns = [
        Column("arch", "arch", "text"),
        Column("n", "seeds", "int"),
        *[Column(c.key, c.header, c.kind, "msd", c.digits) for c in VARIANCE_COLUMNS],
    ]
    rows = seed_rows(with_controller(audits), VARIANCE_PATHS)
    return make_table(
        "variation_over_seeds",
        "Coefficient variation and variance decomposition, mean ± sd over the seeds of one configuration",
        columns,
        rows,
    )


CONDITION_COLUMNS = [  # the NLL's header names the audits' dtype (``condition_columns``)
    Column("nll", "NLL", "float"),
    Column("ci95", "95% CI", "float", "ci"),
    Column("delta", "ΔNLL", "delta"),
    Column("delta_ci95", "ΔNLL 95% CI", "delta", "ci"),
]


def condition_columns(audits: list[dict]) -> list[Column]:
    """``CONDITION_COLUMNS``, the NLL headed with the dtype the audits computed it in (``report.nll_label``)."""
    return [replace(c, header=nll_label(audits)) if c.key == "nll" else c for c in CONDITION_COLUMNS]


def condition_rows(audit: dict, conditions: Sequence[str] | None = None) -> list[dict]:
    names = [c for c in (conditions or AUDIT_CONDITIONS) if c in audit["conditions"]]
    return [
        {
            "model": model_name(audit),
            "arch": audit["model"]["arch"],
            "condition": name,
            **{c.key: audit["conditions"][name][c.key] for c in CONDITION_COLUMNS},
        }
        for name in names
    ]


def assignment_table(audits: list[dict]) -> pd.DataFrame:
    """NLL and ΔNLL (against ``correct``) with 95% bootstrap CIs for every condition, per model."""
    audits = with_controller(audits)
    columns = [Column("model", "model", "text"), Column("condition", "condition", "text"), *condition_columns(audits)]
    rows = [row for audit in audits for row in condition_rows(audit)]
    return make_table(
        "assignment_per_model",
        "Assignment dependence: NLL and ΔNLL vs correct (95% bootstrap CIs over windows), per model",
        columns,
        rows,
    )


def assignment_seed_table(audits: list[dict]) -> pd.DataFrame:
    """ΔNLL of each condition, mean ± sd over the seeds of each configuration (``by_configuration``)."""
    columns = [
        Column("arch", "arch", "text"),
        Column("condition", "condition", "text"),
        Column("n", "seeds", "int"),
        Column("nll", nll_label(with_controller(audits)), "float", "msd"),
        Column("delta", "ΔNLL", "delta", "msd"),
    ]
    rows = []
    for arch, group in by_configuration(with_controller(audits)).items():
        for name in AUDIT_CONDITIONS:
            paths = {"nll": f"conditions.{name}.nll", "delta": f"conditions.{name}.delta"}
            summary = seed_summary(group, paths.values())
            if summary[paths["nll"]] is None:
                continue
            rows.append({"arch": arch, "condition": name, "n": len(group), **{k: summary[p] for k, p in paths.items()}})
    return make_table(
        "assignment_over_seeds",
        "Assignment dependence: NLL and ΔNLL vs correct, mean ± sd over the seeds of one configuration",
        columns,
        rows,
    )


EXECUTION_COLUMNS = [
    Column("blocks_executed", "blocks executed", "int"),
    Column("blocks_total", "blocks present", "int"),
    Column("fraction_executed", "fraction executed", "float"),
    Column("controller_calls", "controller calls", "int"),
    Column("flops", "FLOPs (one batch)", "sci", integer=True),
    Column("latency_ms", "latency ms", "float", digits=2),
    Column("expert_fraction_executed", "expert fraction executed", "float"),  # routers only
    Column("dense_latency_ms", "baseline latency ms", "float", digits=2),
    Column("latency_ratio_vs_dense", "latency / baseline", "float", digits=3),
]


def execution_table(audits: list[dict]) -> pd.DataFrame:
    """What ran: blocks, controller calls, FLOPs, the share of expert evaluations run (routers), latency
    against the baseline: the shape-matched Dense, or for routers the static mixture (every expert for every
    token), per model."""
    columns = [
        Column("model", "model", "text"),
        Column("arch", "arch", "text"),
        Column("baseline", "baseline", "text"),
        *EXECUTION_COLUMNS,
    ]
    rows = [
        {
            "model": model_name(a),
            "arch": a["model"]["arch"],
            "baseline": a["execution"].get("baseline", "dense"),
            **{c.key: a["execution"].get(c.key) for c in EXECUTION_COLUMNS},
        }
        for a in audits
    ]
    return make_table(
        "execution",
        "Conditional execution: what ran, FLOPs and latency against the baseline (the "
        "shape-matched Dense; for routers the static mixture, every expert run for every token)",
        columns,
        rows,
    )


CONTROL_COLUMNS = [
    Column("skip_threshold", "skip threshold", "float"),
    Column("own_fraction_executed", "fraction executed (model)", "float"),
    Column("fraction_executed", "fraction executed (control)", "float"),
    Column("own_flops", "FLOPs (model)", "sci", integer=True),
    Column("flops", "FLOPs (control)", "sci", integer=True),
    Column("own_latency_ratio_vs_dense", "latency / Dense (model)", "float", digits=3),
    Column("latency_ratio_vs_dense", "latency / Dense (control)", "float", digits=3),
]


def positive_control_table(audits: list[dict]) -> pd.DataFrame:
    """The positive control of every FeatureGate audit (``execution.positive_control``: a copy that skips the
    MLP rows whose gates all fall below the calibration median) beside the model's own figures: the audit
    must find the saving that really exists."""
    columns = [Column("model", "model", "text"), *CONTROL_COLUMNS]
    rows = []
    for a in audits:
        control = a["execution"].get("positive_control")
        if control is None:
            continue
        rows.append(
            {
                "model": model_name(a),
                "skip_threshold": control.get("skip_threshold"),
                "own_fraction_executed": a["execution"]["fraction_executed"],
                "fraction_executed": control["fraction_executed"],
                "own_flops": a["execution"]["flops"],
                "flops": control["flops"],
                "own_latency_ratio_vs_dense": a["execution"]["latency_ratio_vs_dense"],
                "latency_ratio_vs_dense": control["latency_ratio_vs_dense"],
            }
        )
    return make_table(
        "positive_control",
        "Positive control: a FeatureGate copy that skips MLP rows whose gates fall below "
        "the calibration median, beside the model itself",
        columns,
        rows,
    )


def execution_seed_table(audits: list[dict]) -> pd.DataFrame:
    paths = {c.key: f"execution.{c.key}" for c in EXECUTION_COLUMNS}
    columns = [
        Column("arch", "arch", "text"),
        Column("n", "seeds", "int"),
        *[Column(c.key, c.header, "float" if c.kind == "int" else c.kind, "msd", c.digits) for c in EXECUTION_COLUMNS],
    ]
    rows = seed_rows(audits, paths)
    return make_table(
        "execution_over_seeds", "Conditional execution, mean ± sd over the seeds of one configuration", columns, rows
    )


MUDD_CONDITIONS = CONDITIONS  # section 4's conditions: MUDDPythia has no routers


def mudd_table(audits: list[dict]) -> pd.DataFrame:
    """The MUDDPythia table: NLL and penalties (ΔNLL vs correct) of cross-input reassignment and token
    shuffling, with the static profiles for comparison."""
    columns = [Column("model", "model", "text"), Column("condition", "condition", "text"), *condition_columns(audits)]
    rows = [row for audit in audits for row in condition_rows(audit, MUDD_CONDITIONS)]
    return make_table(
        "muddpythia_penalties",
        "MUDDPythia: cross-input and token-shuffle penalties (ΔNLL vs correct, 95% bootstrap CIs)",
        columns,
        rows,
    )


def layer_controllers_of(audit: dict, layer: int) -> str:
    """The module paths of decoder layer ``layer``'s controllers, as its sweep row names them (an audit written
    before names none: one controller per layer, controller ``layer``)."""
    row = next((r for r in audit.get("per_layer") or [] if r["layer"] == layer and "controllers" in r), None)
    if row is not None:
        return ", ".join(row["controllers"])
    controllers = audit["model"].get("controllers") or []
    return controllers[layer] if layer < len(controllers) else ""


def per_layer_table(audits: list[dict]) -> pd.DataFrame:
    """The per-layer sweep (``audit.json`` → ``per_layer``): each condition at one decoder layer alone (all its
    controllers together, named by module path), ΔNLL vs correct with its 95% bootstrap CI, one row per model,
    layer and condition."""
    columns = [
        Column("model", "model", "text"),
        Column("layer", "decoder layer", "int"),
        Column("controllers", "its controllers", "text"),
        Column("condition", "condition", "text"),
        Column("nll", nll_label(audits), "float"),
        Column("delta", "ΔNLL", "delta"),
        Column("delta_ci95", "ΔNLL 95% CI", "delta", "ci"),
    ]
    rows = [
        {"model": model_name(a), **row, "controllers": layer_controllers_of(a, row["layer"])}
        for a in audits
        for row in a.get("per_layer") or []
    ]
    return make_table(
        "per_layer",
        "Per decoder layer: each condition at one layer's controllers alone (others correct), ΔNLL vs correct "
        "(95% bootstrap CIs over windows), per model",
        columns,
        rows,
    )


def per_controller_table(audits: list[dict]) -> pd.DataFrame:
    """The sweep's rows of one controller alone (``audit.json`` → ``per_controller``), for the decoder layers that
    hold more than one: the controller by module path, its decoder layer, ΔNLL vs correct with its 95% CI."""
    columns = [
        Column("model", "model", "text"),
        Column("controller", "controller", "text"),
        Column("layer", "decoder layer", "int"),
        Column("condition", "condition", "text"),
        Column("nll", nll_label(audits), "float"),
        Column("delta", "ΔNLL", "delta"),
        Column("delta_ci95", "ΔNLL 95% CI", "delta", "ci"),
    ]
    rows = [{"model": model_name(a), **row} for a in audits for row in a.get("per_controller") or []]
    return make_table(
        "per_controller",
        "Per controller, in decoder layers of several: each condition at one controller alone (others correct), "
        "ΔNLL vs correct (95% bootstrap CIs over windows), per model",
        columns,
        rows,
    )


def per_layer_seed_table(audits: list[dict]) -> pd.DataFrame:
    """The per-layer ΔNLL as mean ± sd over the seeds of each configuration (``by_configuration``) (``aggregate.summarise``)."""
    columns = [
        Column("arch", "arch", "text"),
        Column("layer", "decoder layer", "int"),
        Column("condition", "condition", "text"),
        Column("n", "seeds", "int"),
        Column("delta", "ΔNLL", "delta", "msd"),
    ]
    rows = []
    for arch, group in by_configuration([a for a in audits if a.get("per_layer")]).items():
        cells = [(r["layer"], r["condition"]) for r in group[0]["per_layer"]]
        summary = seed_summary(group, [f"per_layer.{l}.{c}.delta" for l, c in cells])
        rows += [
            {"arch": arch, "layer": l, "condition": c, "n": len(group), "delta": summary[f"per_layer.{l}.{c}.delta"]}
            for l, c in cells
        ]
    return make_table(
        "per_layer_over_seeds",
        "Per decoder layer: ΔNLL vs correct of each condition at one layer's controllers alone, mean ± sd over the "
        "seeds of one configuration",
        columns,
        rows,
    )


DYNAMICS_COLUMNS = [
    Column("nll_correct", "eval NLL"),
    *[Column(f"delta_{c}", f"ΔNLL {c}", "delta") for c in HEADLINE_CONDITIONS],
    Column("delta_cross_input_ci95", "cross_input 95% CI", "delta", "ci"),
    *[Column(f"retention_{p}", p, "pct") for p in RETENTION_PROFILES],
    Column("retention_layer_mean_ci95", "layer_mean 95% CI", "pct", "ci"),
    Column("r2_layer", "R² layer", "pct"),
    Column("r2_layer_slot", "R² layer×slot", "pct"),
    Column("within_std", "within-(layer, slot) std"),
]


ROUTER_DYNAMICS_COLUMNS = [  # what a run of a model with top-k routers logs besides
    Column("delta_layer_mean_topk", "ΔNLL layer_mean_topk", "delta"),
    Column(f"retention_{LAYER_MEAN_TOPK}", LAYER_MEAN_TOPK, "pct"),
    Column("expert_fraction_executed", "expert fraction executed", "float"),
]


def training_dynamics_table(runs: list[dict], steps: Collection[int] | None = None) -> pd.DataFrame:
    """Mini-audit figures of training runs (``training_audit.load_training_runs``) at the audited ``steps``
    (default: every audited step), one row per run and step, read from ``audit_log.csv``; the routers' figures
    when a run has routers (missing for the runs that have none)."""
    routers = any(c.key in run["audit"].columns for run in runs for c in ROUTER_DYNAMICS_COLUMNS)
    columns = [
        Column("run", "run", "text"),
        Column("step", "step", "int"),
        *DYNAMICS_COLUMNS,
        *(ROUTER_DYNAMICS_COLUMNS if routers else []),
    ]
    rows = []
    for run in runs:
        for record in run["audit"].to_dict("records"):
            if steps is not None and record["step"] not in steps:
                continue
            row = {"run": run["name"], **record}
            for c in DYNAMICS_COLUMNS:
                if c.form == "ci":
                    key = c.key.removesuffix("_ci95")
                    row[c.key] = [record[f"{key}_lo"], record[f"{key}_hi"]]
            rows.append(row)
    return make_table(
        "training_dynamics",
        "FCA during training: mini-audit figures at selected steps (audit_log.csv; 95% bootstrap CIs)",
        columns,
        rows,
    )
