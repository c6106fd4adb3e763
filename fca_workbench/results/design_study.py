"""The design studies as DataFrames: one row per trained run, and mean ± sd over its seeds. Two studies share this
reading, told apart by a ``StudyKind``: the controller-design study (issue 27, FeatureGate, the default) and the
router-design study (issue 38, mixtures of experts).

A study folder (``studies/controller_design.py --out`` or ``studies/router_design.py --out``; shipped:
``data/controller_design``, ``data/router_design``) holds one folder per run, ``<variant>-s<seed>/``, with the
run's audit summary and model card. A run folder missing either, or
holding one that is not what the study writes, is left out with one line saying why, so a study still being
trained gives its table. Every number is read from those files; the mean ± sd over seeds is ``seeds.summarise``'s.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import inside_folder, read_json, schema_problem
from fca_workbench.results.audit_tables import seed_summary
from fca_workbench.results.conditions import (
    CROSS_INPUT,
    GLOBAL_MEAN,
    LAYER_MEAN_TOPK,
    RANDOM_TOPK,
    REFERENCE,
    TOKEN_SHUFFLE,
)
from fca_workbench.results.inference import contrast, holm_contrasts
from fca_workbench.results.layout import STUDY_SUMMARY_FILE
from fca_workbench.results.schema import audit_json_schema
from fca_workbench.results.study_kinds import CONTROLLER_STUDY, DEFAULT_VARIANT, OTHER_AXIS, StudyKind
from fca_workbench.results.tabular import Column, format_cell, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd


@dataclass(frozen=True)
class DesignStudy:
    """The readable runs of a study folder (each its summary, with its model card under ``card`` and the figures
    computed from it under ``derived``) and one line for every run folder left out."""

    folder: Path
    runs: list[dict]
    skipped: list[str] = field(default_factory=list)
    kind: StudyKind = CONTROLLER_STUDY


def design_axis(variant: str, settings: dict | None = None, kind: StudyKind = CONTROLLER_STUDY) -> tuple[str, str]:
    """(axis, setting) of a variant: ``groups-96`` is ("gate groups", "96"), ``default`` ("default", "default");
    the setting is the card's training setting where it has one (``range-1tanh`` trains ``1+tanh``), else the
    name's. A name the study does not know is on the axis ``other``."""
    if variant == DEFAULT_VARIANT:
        return DEFAULT_VARIANT, DEFAULT_VARIANT
    prefix, _, suffix = variant.partition("-")
    if prefix not in kind.axes:
        return OTHER_AXIS, variant
    axis, key = kind.axes[prefix]
    value = _setting(settings or {}, key) if key else None
    return axis, str(value) if value is not None else suffix or variant


def _setting(settings: dict, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(settings, dict):
            return None
        settings = settings.get(key)  # type: ignore[assignment]
    return settings


def _axis(run: dict, kind: StudyKind) -> tuple[str, str]:
    return design_axis(run["variant"], run["card"].get("settings"), kind)


def _order(variant: str, kind: StudyKind) -> tuple[int, str]:
    """The default first, then the axes in the study's order, each axis's settings by name."""
    axes = [DEFAULT_VARIANT, *(label for label, _ in kind.axes.values()), OTHER_AXIS]
    return axes.index(design_axis(variant, kind=kind)[0]), variant


STUDIED_REASSIGNMENTS = (CROSS_INPUT, TOKEN_SHUFFLE)  # what the committed studies' summaries replayed

# a profile's retention and its CI are null when the gap they divide by is not there to divide
RETENTION_PROPERTIES = {
    "value": {"type": ["number", "null"]},
    "ci95": {"type": "array", "items": {"type": ["number", "null"]}, "minItems": 2, "maxItems": 2},
}


@functools.cache
def summary_schema(kind: StudyKind = CONTROLLER_STUDY) -> dict:
    """What the tables read of an ``audit_summary.json``: its sections are those of ``audit.schema.json``, with
    the conditions and the retention profiles the tables show required."""
    audit = audit_json_schema()

    def requiring(section: str, names: list[str]) -> dict:
        return {**audit["properties"][section], "type": "object", "required": names}

    retention = {**audit["$defs"]["retention"]}
    retention["properties"] = {**retention["properties"], **RETENTION_PROPERTIES}
    return {
        "$defs": audit["$defs"],
        "type": "object",
        "required": ["variant", "seed", "eval_nll", "conditions", "retention", "variance", *kind.required],
        "properties": {
            "variant": {"type": "string", "minLength": 1},
            "seed": {"type": "integer", "minimum": 0},
            "eval_nll": {"$ref": "#/$defs/number"},
            "export_eval_nll": {"$ref": "#/$defs/number"},
            "conditions": requiring("conditions", [REFERENCE, *STUDIED_REASSIGNMENTS]),
            "retention": {
                **requiring("retention", list(kind.retentions)),
                "properties": {name: retention for name in kind.retentions},
            },
            "variance": {**audit["properties"]["variance"], "type": "object"},
            "execution": {**audit["properties"]["execution"], "type": "object"},
        },
    }


CARD_SCHEMA = {
    "type": "object",
    "required": ["eval_nll", "params"],
    "properties": {"eval_nll": {"type": "number"}, "params": {"type": "integer"}, "settings": {"type": "object"}},
}


def read_checked(folder: Path, run: str, name: str, schema: dict) -> dict:
    path = inside_folder(folder, f"{run}/{name}", run)
    if not path.is_file():
        raise UserError(f"no {name} (an unfinished run?)")
    value = read_json(path)
    problem = schema_problem(value, schema)
    if problem:
        raise UserError(f"{path} is not a study {name}: {problem}")
    assert isinstance(value, dict)  # read_json's default expect
    return value


def expert_entropy(execution: dict) -> float | None:
    """Expert-use entropy: per MoE layer, the entropy of the share of routed tokens each expert got (the audit's
    ``execution.experts.load``) over log(experts), so 1 is uniform use and 0 one expert for every token; the mean
    over layers. None for a model without experts."""
    loads = (execution.get("experts") or {}).get("load") or []
    per_layer = []
    for load in loads:
        total = sum(load)
        if len(load) < 2 or total <= 0:
            continue
        shares = [x / total for x in load if x > 0]
        per_layer.append(-sum(p * math.log(p) for p in shares) / math.log(len(load)))
    return sum(per_layer) / len(per_layer) if per_layer else None


def retention_against(summary: dict, profile: str, reference: str) -> float | None:
    """``profile``'s retention against ``reference`` whichever way the run's audit recorded it (its own reference,
    or among ``other_references``); None where the audit has none against it (audited before that reference
    was replayed) or it does not resolve. Seeds are only ever averaged against one reference."""
    figure = (summary.get("retention") or {}).get(profile)
    if not figure:
        return None
    if figure.get("reference", GLOBAL_MEAN) != reference:
        figure = (figure.get("other_references") or {}).get(reference) or {}
    return figure.get("value")


def derived_figures(summary: dict) -> dict:
    """The figures a study computes from a run's summary rather than reads (``derived.*`` in a ``StudyKind``):
    the expert-use entropy, the static export's cost (its eval NLL minus the model's, same eval windows), and the
    static top-k profile's retention against each reference, the all-expert mixture and the compute-matched
    ``random_topk``."""
    export = summary.get("export_eval_nll")
    return {
        "expert_entropy": expert_entropy(summary.get("execution") or {}),
        "export_cost": None if export is None else round(export - summary["eval_nll"], 4),
        "topk_vs_all_experts": retention_against(summary, LAYER_MEAN_TOPK, GLOBAL_MEAN),
        "topk_vs_random_topk": retention_against(summary, LAYER_MEAN_TOPK, RANDOM_TOPK),
    }


def read_run(folder: Path, run: str, kind: StudyKind = CONTROLLER_STUDY) -> dict:
    """One run's summary with its card under ``card``; a one-line ``UserError`` when either is missing or broken,
    or the folder's name is not the run its summary names (a copied folder would count a seed twice), or the two
    disagree on the eval NLL."""
    summary = read_checked(folder, run, STUDY_SUMMARY_FILE, summary_schema(kind))
    card = read_checked(folder, run, TRAIN_CARD_FILE, CARD_SCHEMA)
    named = f"{summary['variant']}-s{summary['seed']}"
    if named != run:
        raise UserError(f"its {STUDY_SUMMARY_FILE} is the run {named}, not {run}")
    if summary["eval_nll"] != card["eval_nll"]:
        raise UserError(
            f"its {STUDY_SUMMARY_FILE} has eval_nll {summary['eval_nll']}, its {TRAIN_CARD_FILE} {card['eval_nll']}"
        )
    return {**summary, "card": card, "derived": derived_figures(summary)}


def read_design_study(folder: str | Path | None = None, kind: StudyKind = CONTROLLER_STUDY) -> DesignStudy:
    """Every run folder of a study (default: the kind's shipped folder), in name order; a folder that cannot be
    read is skipped with one line. A missing folder, or one without a readable run, is a one-line ``UserError``."""
    folder = Path(folder) if folder else kind.folder
    if not folder.is_dir():
        raise UserError(f"study folder not found: {folder}")
    try:
        names = sorted(
            p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in kind.stages
        )
    except OSError as exc:
        raise UserError(f"cannot list the study folder {folder}: {exc.strerror or first_line(exc)}") from None
    runs, skipped = [], []
    for run in names:
        try:
            runs.append(read_run(folder, run, kind))
        except UserError as exc:
            skipped.append(f"{run}: {exc}")
    if not runs:
        why = f"; {len(skipped)} skipped, the first {skipped[0]}" if skipped else ""
        raise UserError(
            f"no run of the {kind.name.replace('_', '-')} study in {folder} (each is a folder <variant>-s<seed> holding "
            f"{STUDY_SUMMARY_FILE} and {TRAIN_CARD_FILE}){why}"
        )
    return DesignStudy(folder, runs, skipped, kind)


def _figure(run: dict, path: str) -> Any:
    return functools.reduce(lambda tree, key: tree[key], path.split("."), run)


def by_variant(runs: list[dict], kind: StudyKind = CONTROLLER_STUDY) -> dict[str, list[dict]]:
    """The runs of each variant, seeds in order; variants in the study's order (the default first)."""
    groups: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: (_order(r["variant"], kind), r["seed"])):
        groups.setdefault(run["variant"], []).append(run)
    return groups


def design_runs_table(runs: list[dict], kind: StudyKind = CONTROLLER_STUDY) -> pd.DataFrame:
    """One row per run: its variant, design axis, seed and figures, with the audit's 95% CIs (eval NLL: the
    model card's, over its eval windows)."""
    columns = [
        Column("variant", "variant", "text"),
        Column("axis", "design axis", "text"),
        Column("setting", "setting", "text"),
        Column("seed", "seed", "int"),
        Column("params", "params", "int"),
    ]
    for column in kind.columns:
        columns.append(column)
        if column.key in kind.cis:
            columns.append(Column(f"{column.key}_ci95", f"{column.header} 95% CI", column.kind, "ci"))
    rows = [
        {
            "variant": run["variant"],
            **dict(zip(("axis", "setting"), _axis(run, kind))),
            "seed": run["seed"],
            "params": run["card"]["params"],
            **{key: _figure(run, path) for key, path in kind.figures.items()},
            **{f"{key}_ci95": _figure(run, path) for key, path in kind.cis.items()},
        }
        for group in by_variant(runs, kind).values()
        for run in group
    ]
    return make_table(
        f"{kind.name}_runs",
        f"{kind.title}: each run's figures (audit of the whole eval split, 95% bootstrap CIs; eval NLL from "
        "the model card)",
        columns,
        rows,
    )


def design_seed_table(runs: list[dict], kind: StudyKind = CONTROLLER_STUDY) -> pd.DataFrame:
    """One row per variant: how many seeds (and which), and every figure as mean ± sd over them."""
    columns = [
        Column("variant", "variant", "text"),
        Column("axis", "design axis", "text"),
        Column("setting", "setting", "text"),
        Column("n", "seeds", "int"),
        Column("seeds", "seed numbers", "text"),
        *[Column(c.key, c.header, c.kind, "msd", c.digits) for c in kind.columns],
    ]
    rows = []
    for variant, group in by_variant(runs, kind).items():
        summary = seed_summary(group, kind.figures.values())
        axis, setting = _axis(group[0], kind)
        rows.append(
            {
                "variant": variant,
                "axis": axis,
                "setting": setting,
                "n": len(group),
                "seeds": ", ".join(str(r["seed"]) for r in group),
                **{key: summary[path] for key, path in kind.figures.items()},
            }
        )
    return make_table(
        f"{kind.name}_over_seeds", f"{kind.title}: each variant's figures, mean ± sd over seeds", columns, rows
    )


def design_findings(runs: list[dict], kind: StudyKind = CONTROLLER_STUDY) -> pd.DataFrame:
    """What the study calls a finding: one contrast per variant and figure against the default (both with two
    seeds or more), Welch's t on the per-seed values with a Holm correction over the variants compared for that
    figure (``results.inference``); a finding is a Holm-adjusted p below 0.05. Each row gives the difference with
    its 95% CI, Welch's p, the Holm p, the exact permutation p (and the smallest it could reach) and Hedges' g
    with its CI. What does not survive is no row: no difference detected at that many seeds."""
    groups = by_variant(runs, kind)
    columns = [
        Column("variant", "variant", "text"),
        Column("figure", "figure", "text"),
        Column("value", "variant's mean ± sd", "text"),
        Column("default", f"{DEFAULT_VARIANT}'s mean ± sd", "text"),
        Column("difference", "difference [95% CI]", "text"),
        Column("p", "Welch p", "text"),
        Column("holm_p", "Holm p", "text"),
        Column("permutation_p", "permutation p (smallest)", "text"),
        Column("hedges_g", "Hedges' g [95% CI]", "text"),
    ]
    rows, tested = [], 0
    base_runs = groups.get(DEFAULT_VARIANT, [])
    for column in kind.columns if len(base_runs) >= 2 else ():
        path = kind.figures[column.key]
        base = [v for v in (_seed_value(r, path) for r in base_runs) if v is not None]
        contrasts = {}
        for variant, group in groups.items():
            values = [v for v in (_seed_value(r, path) for r in group) if v is not None]
            if variant != DEFAULT_VARIANT and len(values) >= 2 and len(base) >= 2:
                contrasts[variant] = {**contrast(values, base), "values": values}
        tested += len(contrasts)
        for variant, found in holm_contrasts(contrasts).items():
            if found["finding"]:
                rows.append(_finding_row(variant, column, found, base))
    return make_table(
        f"{kind.name}_findings",
        f"{kind.title}: the differences from {DEFAULT_VARIANT} that survive a Holm correction (Welch's t, "
        f"{tested} contrasts; a share's in percentage points)",
        columns,
        rows,
    )


def _seed_value(run: dict, path: str) -> float | None:
    """One run's figure at ``path`` (None where it has none, e.g. a null retention)."""
    value = seed_summary([run], [path])[path]
    return None if value is None else value["mean"]


def _finding_row(variant: str, column: Column, found: dict, base: list[float]) -> dict:
    plain = Column(column.key, column.header, "pct" if column.kind == "pct" else "float", "value", 4)
    msd = Column(column.key, column.header, column.kind, "msd", column.digits)

    def summary(values: list[float]) -> dict:
        return {"mean": statistics.fmean(values), "sd": statistics.stdev(values), "n": len(values)}

    def signed(value: float) -> str:
        return ("+" if value >= 0 else "−") + format_cell(plain, abs(value))

    g = found["hedges_g"]
    lo, hi = found["ci95"]
    return {
        "variant": variant,
        "figure": column.header,
        "value": format_cell(msd, summary(found["values"])),
        "default": format_cell(msd, summary(base)),
        "difference": f"{signed(found['difference'])} [{signed(lo)}, {signed(hi)}]",
        "p": f"{found['p']:.3g}",
        "holm_p": f"{found['holm_p']:.3g}",
        "permutation_p": f"{found['permutation_p']:.3g} ({found['smallest_permutation_p']:.3g})",
        "hedges_g": "n/a" if g["value"] is None else f"{g['value']:+.2f} [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]",
    }


def design_points(runs: list[dict], kind: StudyKind = CONTROLLER_STUDY) -> pd.DataFrame:
    """What the notebook plots, one row per variant and figure: the value (one seed's, or the mean), its error
    bar (one seed: the audit's 95% CI, where it has one; several: ± the sd over seeds), the per-seed values,
    and an x label that says how many seeds the point has."""
    import pandas as pd

    rows = []
    for variant, group in by_variant(runs, kind).items():
        summary = seed_summary(group, kind.figures.values())
        axis, setting = _axis(group[0], kind)
        for key, path in kind.figures.items():
            figure = summary[path]
            if figure is None:  # a figure some seed lacks (a null retention): no point
                continue
            n = len(group)
            low, high = figure["mean"] - figure["sd"], figure["mean"] + figure["sd"]
            error = f"± sd over {n} seeds"
            if n == 1:
                ci = _figure(group[0], kind.cis[key]) if key in kind.cis else None
                low, high = ci if ci and None not in ci else (figure["mean"], figure["mean"])
                error = "95% CI" if ci else "one seed, no CI"
            rows.append(
                {
                    "variant": variant,
                    "axis": axis,
                    "setting": setting,
                    "label": f"{setting} (n={n})",
                    "figure": key,
                    "n": n,
                    "value": figure["mean"],
                    "error_minus": figure["mean"] - low,
                    "error_plus": high - figure["mean"],
                    "error": error,
                    "values": figure["values"],
                }
            )
    return pd.DataFrame(rows)
