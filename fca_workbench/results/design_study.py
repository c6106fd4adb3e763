"""The controller-design study (issue 27) as DataFrames: one row per trained run, and mean ± sd over its seeds.

A study folder (``benchmarks/controller_design.py --out``; shipped: ``data/controller_design``) holds one folder
per run, ``<variant>-s<seed>/``, with the run's audit summary and model card. A run folder missing either, or
holding one that is not what the study writes, is left out with one line saying why, so a study still being
trained gives its table. Every number is read from those files; the mean ± sd over seeds is ``seeds.summarise``'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import inside_folder, read_json, schema_problem
from fca_workbench.foundation.resources import shipped
from fca_workbench.results.audit_tables import seed_summary
from fca_workbench.results.conditions import LAYER_MEAN, REASSIGNMENTS, REFERENCE
from fca_workbench.results.layout import STUDY_SUMMARY_FILE
from fca_workbench.results.schema import audit_json_schema
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd

STUDY_DIR = shipped("data") / "controller_design"  # the shipped study, in a checkout or a wheel
DEFAULT_VARIANT = "default"
# a variant's name is ``<axis prefix>-<setting>`` (``groups-96``); ``combo`` changes several axes at once. Each
# axis: its label, and the training setting (in the model card) that holds the variant's value on it
AXES = {
    "range": ("gate range", "gate_range"),
    "input": ("gate input", "gate_input"),
    "groups": ("gate groups", "gate_groups"),
    "cwd": ("controller weight decay", "controller_weight_decay"),
    "clr": ("controller lr multiplier", "controller_lr_mult"),
    "wide": ("width × depth", None),
    "combo": ("combo", None),
}
OTHER_AXIS = "other"

# column -> where the figure is in a run's summary, and its 95% CI where the audit gives one
FIGURES = {
    "eval_nll": "eval_nll",
    "retention_layer_mean": "retention.layer_mean.value",
    "r2_layer": "variance.r2_layer",
    "r2_layer_slot": "variance.r2_layer_slot",
    "delta_cross_input": "conditions.cross_input.delta",
    "delta_token_shuffle": "conditions.token_shuffle.delta",
}
CIS = {
    "retention_layer_mean": "retention.layer_mean.ci95",
    "delta_cross_input": "conditions.cross_input.delta_ci95",
    "delta_token_shuffle": "conditions.token_shuffle.delta_ci95",
}
FIGURE_COLUMNS = [
    Column("eval_nll", "eval NLL", "float"),
    Column("retention_layer_mean", "retention layer_mean", "pct"),
    Column("r2_layer", "R² layer", "pct"),
    Column("r2_layer_slot", "R² layer×slot", "pct"),
    Column("delta_cross_input", "ΔNLL cross_input", "delta"),
    Column("delta_token_shuffle", "ΔNLL token_shuffle", "delta"),
]


@dataclass(frozen=True)
class DesignStudy:
    """The readable runs of a study folder (each its summary, with its model card under ``card``) and one line
    for every run folder left out."""

    folder: Path
    runs: list[dict]
    skipped: list[str] = field(default_factory=list)


def design_axis(variant: str, settings: dict | None = None) -> tuple[str, str]:
    """(axis, setting) of a variant: ``groups-96`` is ("gate groups", "96"), ``default`` ("default", "default");
    the setting is the card's training setting where it has one (``range-1tanh`` trains ``1+tanh``), else the
    name's. A name the study does not know is on the axis ``other``."""
    if variant == DEFAULT_VARIANT:
        return DEFAULT_VARIANT, DEFAULT_VARIANT
    prefix, _, suffix = variant.partition("-")
    if prefix not in AXES:
        return OTHER_AXIS, variant
    axis, key = AXES[prefix]
    value = (settings or {}).get(key) if key else None
    return axis, str(value) if value is not None else suffix or variant


def _axis(run: dict) -> tuple[str, str]:
    return design_axis(run["variant"], run["card"].get("settings"))


def _order(variant: str) -> tuple[int, str]:
    """The default first, then the axes in the study's order, each axis's settings by name."""
    axes = [DEFAULT_VARIANT, *(label for label, _ in AXES.values()), OTHER_AXIS]
    return axes.index(design_axis(variant)[0]), variant


# a profile's retention and its CI are null when the gap they divide by is not there to divide
RETENTION_PROPERTIES = {
    "value": {"type": ["number", "null"]},
    "ci95": {"type": "array", "items": {"type": ["number", "null"]}, "minItems": 2, "maxItems": 2},
}


@functools.cache
def summary_schema() -> dict:
    """What the tables read of an ``audit_summary.json``: its sections are those of ``audit.schema.json``, with
    the conditions and the retention profile the tables show required."""
    audit = audit_json_schema()

    def requiring(section: str, names: list[str]) -> dict:
        return {**audit["properties"][section], "type": "object", "required": names}

    return {
        "$defs": audit["$defs"],
        "type": "object",
        "required": ["variant", "seed", "eval_nll", "conditions", "retention", "variance"],
        "properties": {
            "variant": {"type": "string", "minLength": 1},
            "seed": {"type": "integer", "minimum": 0},
            "eval_nll": {"$ref": "#/$defs/number"},
            "conditions": requiring("conditions", [REFERENCE, *REASSIGNMENTS]),
            "retention": {
                **requiring("retention", [LAYER_MEAN]),
                "properties": {LAYER_MEAN: {**audit["$defs"]["retention"], "properties": RETENTION_PROPERTIES}},
            },
            "variance": {**audit["properties"]["variance"], "type": "object"},
        },
    }


CARD_SCHEMA = {
    "type": "object",
    "required": ["eval_nll", "params"],
    "properties": {"eval_nll": {"type": "number"}, "params": {"type": "integer"}, "settings": {"type": "object"}},
}


def _read_checked(folder: Path, run: str, name: str, schema: dict) -> dict:
    path = inside_folder(folder, f"{run}/{name}", run)
    if not path.is_file():
        raise UserError(f"no {name} (an unfinished run?)")
    value = read_json(path)
    problem = schema_problem(value, schema)
    if problem:
        raise UserError(f"{path} is not a study {name}: {problem}")
    assert isinstance(value, dict)  # read_json's default expect
    return value


def read_run(folder: Path, run: str) -> dict:
    """One run's summary with its card under ``card``; a one-line ``UserError`` when either is missing or broken,
    or the folder's name is not the run its summary names (a copied folder would count a seed twice), or the two
    disagree on the eval NLL."""
    summary = _read_checked(folder, run, STUDY_SUMMARY_FILE, summary_schema())
    card = _read_checked(folder, run, TRAIN_CARD_FILE, CARD_SCHEMA)
    named = f"{summary['variant']}-s{summary['seed']}"
    if named != run:
        raise UserError(f"its {STUDY_SUMMARY_FILE} is the run {named}, not {run}")
    if summary["eval_nll"] != card["eval_nll"]:
        raise UserError(
            f"its {STUDY_SUMMARY_FILE} has eval_nll {summary['eval_nll']}, its {TRAIN_CARD_FILE} {card['eval_nll']}"
        )
    return {**summary, "card": card}


def read_design_study(folder: str | Path | None = None) -> DesignStudy:
    """Every run folder of a study (default: the shipped ``data/controller_design``), in name order; a folder
    that cannot be read is skipped with one line. A missing folder, or one without a readable run, is a one-line
    ``UserError``."""
    folder = Path(folder) if folder else STUDY_DIR
    if not folder.is_dir():
        raise UserError(f"study folder not found: {folder}")
    try:
        names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        raise UserError(f"cannot list the study folder {folder}: {exc.strerror or first_line(exc)}") from None
    runs, skipped = [], []
    for run in names:
        try:
            runs.append(read_run(folder, run))
        except UserError as exc:
            skipped.append(f"{run}: {exc}")
    if not runs:
        why = f"; {len(skipped)} skipped, the first {skipped[0]}" if skipped else ""
        raise UserError(
            f"no run of the controller-design study in {folder} (each is a folder <variant>-s<seed> holding "
            f"{STUDY_SUMMARY_FILE} and {TRAIN_CARD_FILE}){why}"
        )
    return DesignStudy(folder, runs, skipped)


def _figure(run: dict, path: str) -> Any:
    return functools.reduce(lambda tree, key: tree[key], path.split("."), run)


def by_variant(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs of each variant, seeds in order; variants in the study's order (the default first)."""
    groups: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: (_order(r["variant"]), r["seed"])):
        groups.setdefault(run["variant"], []).append(run)
    return groups


def design_runs_table(runs: list[dict]) -> pd.DataFrame:
    """One row per run: its variant, design axis, seed and figures, with the audit's 95% CIs (eval NLL: the
    model card's, over its eval windows)."""
    columns = [
        Column("variant", "variant", "text"),
        Column("axis", "design axis", "text"),
        Column("setting", "setting", "text"),
        Column("seed", "seed", "int"),
        Column("params", "params", "int"),
    ]
    for column in FIGURE_COLUMNS:
        columns.append(column)
        if column.key in CIS:
            columns.append(Column(f"{column.key}_ci95", f"{column.header} 95% CI", column.kind, "ci"))
    rows = [
        {
            "variant": run["variant"],
            **dict(zip(("axis", "setting"), _axis(run))),
            "seed": run["seed"],
            "params": run["card"]["params"],
            **{key: _figure(run, path) for key, path in FIGURES.items()},
            **{f"{key}_ci95": _figure(run, path) for key, path in CIS.items()},
        }
        for group in by_variant(runs).values()
        for run in group
    ]
    return make_table(
        "controller_design_runs",
        "Controller design: each run's figures (audit of the whole eval split, 95% bootstrap CIs; eval NLL from "
        "the model card)",
        columns,
        rows,
    )


def design_seed_table(runs: list[dict]) -> pd.DataFrame:
    """One row per variant: how many seeds (and which), and every figure as mean ± sd over them."""
    columns = [
        Column("variant", "variant", "text"),
        Column("axis", "design axis", "text"),
        Column("setting", "setting", "text"),
        Column("n", "seeds", "int"),
        Column("seeds", "seed numbers", "text"),
        *[Column(c.key, c.header, c.kind, "msd", c.digits) for c in FIGURE_COLUMNS],
    ]
    rows = []
    for variant, group in by_variant(runs).items():
        summary = seed_summary(group, FIGURES.values())
        axis, setting = _axis(group[0])
        rows.append(
            {
                "variant": variant,
                "axis": axis,
                "setting": setting,
                "n": len(group),
                "seeds": ", ".join(str(r["seed"]) for r in group),
                **{key: summary[path] for key, path in FIGURES.items()},
            }
        )
    return make_table(
        "controller_design_over_seeds", "Controller design: each variant's figures, mean ± sd over seeds", columns, rows
    )


def design_points(runs: list[dict]) -> pd.DataFrame:
    """What the notebook plots, one row per variant and figure: the value (one seed's, or the mean), its error
    bar (one seed: the audit's 95% CI, where it has one; several: ± the sd over seeds), the per-seed values,
    and an x label that says how many seeds the point has."""
    import pandas as pd

    rows = []
    for variant, group in by_variant(runs).items():
        summary = seed_summary(group, FIGURES.values())
        axis, setting = _axis(group[0])
        for key, path in FIGURES.items():
            figure = summary[path]
            if figure is None:  # a figure some seed lacks (a null retention): no point
                continue
            n = len(group)
            low, high = figure["mean"] - figure["sd"], figure["mean"] + figure["sd"]
            error = f"± sd over {n} seeds"
            if n == 1:
                ci = _figure(group[0], CIS[key]) if key in CIS else None
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
