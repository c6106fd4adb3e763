"""Two audits side by side: two seeds, a model and its exported static model, one model on two eval sets.

``comparison`` refuses in one line what cannot be compared: the same text cut into windows of different lengths,
or into different tokens (the eval windows' fingerprint, which ``audit.json`` records, differs while the text,
window and count agree: different tokenizers). Otherwise it says what differs (model, eval data, calibration,
settings) and puts each figure of both audits next to each other with the difference (second minus first).
Every number is read from the two ``audit.json`` files; the tables are ``tables.Column`` tables, so the app
shows and downloads them as it does every other table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.audit_tables import model_name, per_layer_table
from fca_workbench.results.conditions import ALL_CONDITIONS, RETAINED
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:
    import pandas as pd

FIGURES = (  # (row label, dotted path in audit.json) of the one-number figures compared
    ("R² layer", "variance.r2_layer"),
    ("R² layer×slot", "variance.r2_layer_slot"),
    ("within-(layer, slot) std", "variation.within_std"),
    ("CV", "variation.cv"),
    ("fraction executed", "execution.fraction_executed"),
    ("expert fraction executed", "execution.expert_fraction_executed"),
    ("GFLOP (one batch)", "execution.flops"),
    ("latency / baseline", "execution.latency_ratio_vs_dense"),
)
SCALES = {"execution.flops": 1e-9}  # a figure compared in larger units (FLOPs as GFLOP: 3.4351, not 3435134976.0)
LATENCY_BASELINES = {  # what ``execution.baseline`` ran, as the comparison names it
    "dense": "a shape-matched Dense",
    "static_mixture": "the static mixture (every expert for every token)",
    "same_model": "the same model",
}
SETTINGS_SHOWN = ("seed", "resamples", "max_windows", "window_sampling", "per_layer", "dtype", "latency_repeats")


@dataclass(frozen=True)
class Comparison:
    """What differs between audits ``first`` and ``second`` (by name), and their figures side by side."""

    first: str
    second: str
    differences: list[str]
    tables: list[pd.DataFrame]
    per_layer: tuple[pd.DataFrame, pd.DataFrame] | None  # both audits' sweeps, when both have one


def _dig(tree: dict | None, path: str) -> object:
    for part in path.split("."):
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree


def _scaled(value: object, scale: float) -> object:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value * scale if numeric and scale != 1.0 else value  # type: ignore[operator]


def _difference(first: object, second: object) -> float | None:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (first, second))
    return float(second) - float(first) if numbers else None  # type: ignore[arg-type]


def refusal(first: dict, second: dict, names: tuple[str, str]) -> str | None:
    """Why the two audits' NLLs cannot be compared, in one line; None when they can."""
    a, b = first["data"]["eval"], second["data"]["eval"]
    if a["window"] != b["window"]:
        return (
            f"{names[0]} scores eval windows of {a['window']} tokens, {names[1]} of {b['window']}: "
            "NLLs over different contexts cannot be compared"
        )
    same_text = PurePath(a["source"]).name == PurePath(b["source"]).name and a["windows"] == b["windows"]
    if same_text and a.get("fingerprint") != b.get("fingerprint"):
        return (
            f"{names[0]} and {names[1]} cut the same eval text into different tokens (the eval windows' "
            "fingerprints differ): different tokenizers, whose NLLs cannot be compared"
        )
    return None


def differences(first: dict, second: dict, names: tuple[str, str]) -> list[str]:
    """What differs between two comparable audits, one line each (never a server path: file names only)."""
    found = []
    ma, mb = first["model"], second["model"]
    if ma["fingerprint"] == mb["fingerprint"]:
        found.append("the same model (fingerprints match)")
    else:
        found.append(
            f"different models: {model_name(first)} ({ma['arch']}, {ma['params']:,} parameters) vs "
            f"{model_name(second)} ({mb['arch']}, {mb['params']:,} parameters)"
        )
    for split in ("eval", "calibration"):
        a, b = first["data"][split], second["data"][split]
        if a.get("fingerprint") != b.get("fingerprint"):
            found.append(
                f"different {split} windows: {PurePath(a['source']).name} ({a['windows']} windows) vs "
                f"{PurePath(b['source']).name} ({b['windows']} windows)"
                + (": the figures are over different text" if split == "eval" else "")
            )
    baselines = [audit["execution"].get("baseline") for audit in (first, second)]
    if baselines[0] != baselines[1]:
        said = [LATENCY_BASELINES.get(str(b), "an unrecorded baseline") for b in baselines]
        found.append(
            f"different latency baselines: {names[0]} against {said[0]}, {names[1]} against {said[1]}: "
            "their latency / baseline ratios are not against the same thing"
        )
    for key in SETTINGS_SHOWN:
        a, b = first["settings"].get(key), second["settings"].get(key)
        if a != b:
            found.append(f"setting {key}: {a} vs {b}")
    return found


def comparison(first: dict, second: dict, names: tuple[str, str]) -> Comparison:
    """The two audits side by side; a ``UserError`` (one line) when they are the same or cannot be compared."""
    if names[0] == names[1]:
        raise UserError(f"pick two different audits to compare (both are {names[0]})")
    refused = refusal(first, second, names)
    if refused:
        raise UserError(refused)
    sweeps = (per_layer_table([first]), per_layer_table([second]))
    return Comparison(
        first=names[0],
        second=names[1],
        differences=differences(first, second, names),
        tables=[
            condition_comparison(first, second, names),
            retention_comparison(first, second, names),
            figure_comparison(first, second, names),
        ]
        + ([per_layer_comparison(first, second, names)] if all(len(s) for s in sweeps) else []),
        per_layer=sweeps if all(len(s) for s in sweeps) else None,
    )


def _side_by_side(names: tuple[str, str], kind: str, key: Column) -> list[Column]:
    return [
        key,
        Column("first", names[0], kind),
        Column("second", names[1], kind),
        Column("difference", f"{names[1]} − {names[0]}", "delta" if kind == "float" else kind),
    ]


def condition_comparison(first: dict, second: dict, names: tuple[str, str]) -> pd.DataFrame:
    """ΔNLL vs correct of each condition both audits have (with their CIs), and the difference of the two."""
    columns = [
        Column("condition", "condition", "text"),
        Column("first", f"ΔNLL {names[0]}", "delta"),
        Column("first_ci95", f"{names[0]} 95% CI", "delta", "ci"),
        Column("second", f"ΔNLL {names[1]}", "delta"),
        Column("second_ci95", f"{names[1]} 95% CI", "delta", "ci"),
        Column("difference", "difference", "delta"),
        Column("nll_first", f"NLL {names[0]}", "float"),
        Column("nll_second", f"NLL {names[1]}", "float"),
    ]
    rows = []
    for name in shared_names(ALL_CONDITIONS, first["conditions"], second["conditions"]):
        a, b = first["conditions"].get(name), second["conditions"].get(name)
        if a is None or b is None:
            continue
        rows.append(
            {
                "condition": name,
                "first": a["delta"],
                "first_ci95": a["delta_ci95"],
                "second": b["delta"],
                "second_ci95": b["delta_ci95"],
                "difference": b["delta"] - a["delta"],
                "nll_first": a["nll"],
                "nll_second": b["nll"],
            }
        )
    return make_table(
        "compare_conditions",
        "ΔNLL vs correct of each condition in both audits (95% CIs), and their difference",
        columns,
        rows,
    )


def shared_names(built_in: Sequence[str], first: dict, second: dict) -> list[str]:
    """The names both audits hold: the built-in ones in report order, then any registered condition's."""
    return [name for name in dict.fromkeys([*built_in, *first]) if name in first and name in second]


def retention_comparison(first: dict, second: dict, names: tuple[str, str]) -> pd.DataFrame:
    """Gap retention of each static profile both audits have."""
    rows = []
    for profile in shared_names(RETAINED, first["retention"], second["retention"]):
        a, b = (_dig(audit, f"retention.{profile}.value") for audit in (first, second))
        rows.append({"profile": profile, "first": a, "second": b, "difference": _difference(a, b)})
    return make_table(
        "compare_retention",
        "Static profiles: share of the Correct-to-GlobalMean gap retained in both audits",
        _side_by_side(names, "pct", Column("profile", "profile", "text")),
        rows,
    )


def figure_comparison(first: dict, second: dict, names: tuple[str, str]) -> pd.DataFrame:
    """Variation, variance decomposition and execution figures (each where either audit has it)."""
    rows = []
    for label, path in FIGURES:
        a, b = (_scaled(_dig(audit, path), SCALES.get(path, 1.0)) for audit in (first, second))
        if a is not None or b is not None:
            rows.append({"figure": label, "first": a, "second": b, "difference": _difference(a, b)})
    return make_table(
        "compare_figures",
        "Coefficient variation, variance decomposition and execution in both audits",
        _side_by_side(names, "float", Column("figure", "figure", "text")),
        rows,
    )


def per_layer_comparison(first: dict, second: dict, names: tuple[str, str]) -> pd.DataFrame:
    """ΔNLL of each condition at one decoder layer alone (its controllers together), in both sweeps, for the
    (layer, condition) cells both have."""
    cells = {(r["layer"], r["condition"]): r["delta"] for r in second["per_layer"]}
    rows = [
        {
            "layer": r["layer"],
            "condition": r["condition"],
            "first": r["delta"],
            "second": cells[(r["layer"], r["condition"])],
            "difference": cells[(r["layer"], r["condition"])] - r["delta"],
        }
        for r in first["per_layer"]
        if (r["layer"], r["condition"]) in cells
    ]
    columns = [
        Column("layer", "decoder layer", "int"),
        *_side_by_side(names, "delta", Column("condition", "condition", "text")),
    ]
    return make_table(
        "compare_per_layer",
        "Per decoder layer: ΔNLL vs correct of each condition at one layer's controllers alone, in both sweeps",
        columns,
        rows,
    )
