"""An audit's results as pandas DataFrames: ``load_audit(folder)`` for one, ``load_audits`` for several.

A notebook user filters, sorts, pivots and plots DataFrames; this module turns an audit folder
(``audit.json``, ``per_token_nll.csv.gz`` or ``.parquet``) into them, value for value, and writes the
per-token file the audit leaves behind. pandas is imported here, never by ``import fca_workbench``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from fca_workbench.foundation.checkpoint import recorded_name
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, reading, schema_problem
from fca_workbench.results.binding import FINGERPRINT, RERUN_AUDIT, audit_binding, check_binding, downstream_binding
from fca_workbench.results.layout import AUDIT_FILE, DOWNSTREAM_FILE, PER_TOKEN_CSV, PER_TOKEN_PARQUET
from fca_workbench.results.overview import overview_table
from fca_workbench.results.per_token import PER_TOKEN_KEYS, _has_pyarrow, per_token_binding
from fca_workbench.results.schema import read_audit_json

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd

CONDITION_COLUMNS = ["nll", "ci95_lo", "ci95_hi", "delta", "delta_ci95_lo", "delta_ci95_hi"]


RETENTION_COLUMNS = ["value", "ci95_lo", "ci95_hi", "gap", "gap_ci95_lo", "gap_ci95_hi"]  # gap: the denominator


VARIANCE_COLUMNS = ["r2_layer", "r2_layer_slot", "r2_layer_slot_position", "r2_layer_slot_window", "within_std", "cv"]


EXECUTION_DTYPES = {
    "blocks_executed": "int64",
    "blocks_total": "int64",
    "fraction_executed": "float64",
    "controller_calls": "int64",
    "flops": "int64",
    "latency_ms": "float64",
    "dense_latency_ms": "float64",
    "latency_ratio_vs_dense": "float64",
}


EXECUTION_COLUMNS = list(EXECUTION_DTYPES)


PER_LAYER_COLUMNS = ["nll", "delta", "delta_ci95_lo", "delta_ci95_hi"]


DOWNSTREAM_SCHEMA = "fca-downstream/2"  # /2: per condition its clustered gap against correct, retention with both ends
OLDER_DOWNSTREAM_SCHEMAS = ("fca-downstream/1",)  # refused when read (no clustered errors), replaced by fca eval
DOWNSTREAM_KEYS = ["task", "condition", "metric"]
DOWNSTREAM_COLUMNS = [  # the numbers of one figure, flat (``downstream_row``)
    "value",
    "stderr",
    "gap",
    "gap_stderr",
    "gap_ci95_lo",
    "gap_ci95_hi",
    "gap_clusters",
    "retention",
    "retention_ci95_lo",
    "retention_ci95_hi",
    "numerator",
    "denominator",
]
_NUMBER = {"type": ["number", "null"]}
_CI = {"type": "array", "minItems": 2, "maxItems": 2, "items": _NUMBER}
_DIFFERENCE = {  # gaps.difference: a paired difference over the same documents, clustered
    "type": "object",
    "required": ["value", "stderr", "ci95", "clusters", "df", "paired"],
    "properties": {
        "value": _NUMBER,
        "stderr": _NUMBER,
        "ci95": _CI,
        "clusters": {"type": ["integer", "null"]},
        "df": {"type": ["integer", "null"]},
        "paired": {"type": "boolean"},
    },
}
_RETENTION = {  # gaps.retention
    "type": ["object", "null"],
    "required": ["value", "ci95", "resolved", "reference", "numerator", "denominator"],
    "properties": {
        "value": _NUMBER,
        "ci95": _CI,
        "resolved": {"type": "boolean"},
        "reference": {"type": "string"},
        "numerator": _DIFFERENCE,
        "denominator": _DIFFERENCE,
        "other_references": {"type": "object", "additionalProperties": {"$ref": "#/$defs/retention"}},
    },
}
_FIGURE = {
    "type": "object",
    "required": ["value", "stderr", "gap", "retention"],
    "properties": {
        "value": _NUMBER,
        "stderr": _NUMBER,
        "gap": {"oneOf": [{"type": "null"}, _DIFFERENCE]},
        "retention": {"$ref": "#/$defs/retention"},
    },
}
DOWNSTREAM_JSON_SCHEMA = {  # what fca eval writes and load_audit reads (fca_workbench/downstream/evaluation.py)
    "type": "object",
    "$defs": {"retention": _RETENTION},
    "required": ["schema", "model", "settings", "calibration", "tasks"],
    "properties": {
        "schema": {"const": DOWNSTREAM_SCHEMA},
        "model": {
            "type": "object",
            "required": ["path", "arch", "fingerprint"],
            "properties": {
                "fingerprint": FINGERPRINT,
                "hub": {"type": ["object", "null"], "required": ["id", "revision", "commit"]},  # Checkpoint.record
            },
        },
        "calibration": {"type": "object", "properties": {"fingerprint": FINGERPRINT}},
        "settings": {"type": "object", "required": ["tasks", "conditions", "limit", "seed", "dtype", "lm_eval"]},
        "tasks": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["samples", "clusters", "conditions"],
                "properties": {
                    "samples": {"type": ["integer", "null"]},
                    "clusters": {
                        "type": "object",
                        "required": ["field", "count"],
                        "properties": {"field": {"type": ["string", "null"]}, "count": {"type": "integer"}},
                    },
                    "conditions": {
                        "type": "object",
                        "additionalProperties": {"type": "object", "additionalProperties": _FIGURE},
                    },
                },
            },
        },
    },
}


def check_downstream(downstream: object, path: Path) -> None:
    """Refuse, in one line, a ``downstream.json`` (read, or about to be written) that is not ``fca-downstream/2``;
    one an older ``fca eval`` wrote (``fca-downstream/1``: no clustered errors, a router's retention against
    ``global_mean``) is refused with what to run instead."""
    schema = downstream.get("schema") if isinstance(downstream, dict) else None
    if schema in OLDER_DOWNSTREAM_SCHEMAS:
        raise UserError(
            f"{path} is {schema}, written by an older fca eval (its gaps have no clustered errors); rerun fca eval "
            f"to write {DOWNSTREAM_SCHEMA} over it"
        )
    problem = schema_problem(downstream, DOWNSTREAM_JSON_SCHEMA)
    if problem:
        raise UserError(f"{path} is not a valid {DOWNSTREAM_SCHEMA} file ({problem})")


def downstream_row(figure: dict) -> dict:
    """One condition's figure of one metric as flat ``DOWNSTREAM_COLUMNS`` (and the retention's ``reference``): its
    retention's numbers only where it resolves (an unresolved one is no figure, so no percentage)."""
    g, kept = figure["gap"] or {}, figure["retention"] or {}
    shown = kept if kept.get("resolved") else {}
    ci, gap_ci = shown.get("ci95") or [None, None], g.get("ci95") or [None, None]
    return {
        "value": figure["value"],
        "stderr": figure["stderr"],
        "gap": g.get("value"),
        "gap_stderr": g.get("stderr"),
        "gap_ci95_lo": gap_ci[0],
        "gap_ci95_hi": gap_ci[1],
        "gap_clusters": g.get("clusters"),
        "retention": shown.get("value"),
        "retention_ci95_lo": ci[0],
        "retention_ci95_hi": ci[1],
        "reference": kept.get("reference"),
        "numerator": (kept.get("numerator") or {}).get("value"),
        "denominator": (kept.get("denominator") or {}).get("value"),
    }


def read_downstream(path: Path, audit: dict) -> dict:
    """The ``downstream.json`` at ``path`` beside ``audit`` (its ``audit.json``), refused in one line when it is
    not ``fca-downstream/2`` or is of another model than the audit's (``binding.check_binding``)."""
    read = read_json(path)
    check_downstream(read, path)
    downstream = cast(dict, read)  # checked just above
    advice = "run fca eval with the audit's own checkpoint, or keep that downstream.json in another folder"
    check_binding(
        downstream_binding(downstream), audit_binding(audit, ()), str(path), f"the {AUDIT_FILE} beside it", advice
    )
    return downstream


def _split_ci(value) -> tuple:
    return tuple(value) if value else (None, None)


class AuditResults:
    """One audit: its metadata as dicts, its figures as DataFrames (full precision, column names and dtypes
    pinned by the tests), the per-token NLLs read only when asked for."""

    def __init__(self, path: str | Path):
        self.audit, self.folder = read_audit_json(path)
        self.name = recorded_name(self.audit["model"])
        self.model, self.data, self.settings = self.audit["model"], self.audit["data"], self.audit["settings"]
        self.verdicts = self.audit["verdict"]

    def __repr__(self) -> str:
        return f"<AuditResults {self.name} ({self.model['arch']}) from {self.folder}>"

    @functools.cached_property
    def conditions(self) -> pd.DataFrame:
        """One row per condition: NLL with its 95% CI, ΔNLL against the reference with its 95% CI."""
        rows = [
            (name, f["nll"], *f["ci95"], f["delta"], *f["delta_ci95"]) for name, f in self.audit["conditions"].items()
        ]
        return _frame(rows, "condition", CONDITION_COLUMNS)

    @functools.cached_property
    def retention(self) -> pd.DataFrame:
        """One row per static profile: share of the gap between its reference and correct retained, with its 95%
        CI (NaN: the gap does not resolve), and that gap (the denominator, nats) with its 95% CI."""
        rows = [
            (name, r["value"], *_split_ci(r["ci95"]), (r.get("denominator") or {}).get("value"),
             *_split_ci((r.get("denominator") or {}).get("ci95")))
            for name, r in self.audit["retention"].items()
        ]  # fmt: skip
        return _frame(rows, "profile", RETENTION_COLUMNS)

    @functools.cached_property
    def variance(self) -> pd.DataFrame:
        """One row (none for a model without coefficients): R² of the static structure, within-std, CV."""
        figures = {**(self.audit["variance"] or {}), **(self.audit["variation"] or {})}
        rows = [tuple(figures.get(k) for k in VARIANCE_COLUMNS)] if self.audit["variance"] else []
        return _numbers(rows, VARIANCE_COLUMNS)

    @functools.cached_property
    def execution(self) -> pd.DataFrame:
        """One row for the model, and one for its positive control when the audit has one (``run``)."""
        import pandas as pd

        execution = self.audit["execution"]
        runs = {"model": execution, "positive_control": execution.get("positive_control")}
        rows = [{"run": run, **{k: figures[k] for k in EXECUTION_COLUMNS}} for run, figures in runs.items() if figures]
        return pd.DataFrame(rows).astype({"run": "str", **{k: EXECUTION_DTYPES[k] for k in EXECUTION_COLUMNS}})

    @functools.cached_property
    def per_layer(self) -> pd.DataFrame | None:
        """One row per (layer, condition) of a per-layer sweep; ``None`` when the audit has none."""
        if self.audit.get("per_layer") is None:
            return None
        rows = [(r["condition"], r["nll"], r["delta"], *r["delta_ci95"]) for r in self.audit["per_layer"]]
        frame = _frame(rows, "condition", PER_LAYER_COLUMNS)
        frame.insert(0, "layer", np.array([r["layer"] for r in self.audit["per_layer"]], dtype=np.int64))
        return frame

    @functools.cached_property
    def downstream(self) -> pd.DataFrame:
        """One row per (task, condition, metric) of ``fca eval``: value, lm-eval's stderr, the gap against correct
        with its clustered stderr, interval and cluster count, the retention (None where it does not resolve) with
        its interval, ends and ``reference``; empty when the folder has no ``downstream.json``."""
        import pandas as pd

        path = self.folder / DOWNSTREAM_FILE
        rows = []
        if path.is_file():
            downstream = read_downstream(path, self.audit)
            for task, entry in downstream["tasks"].items():
                for condition, metrics in entry["conditions"].items():
                    rows += [((task, condition, m), downstream_row(f)) for m, f in metrics.items()]
        frame = _numbers([[row[1][k] for k in DOWNSTREAM_COLUMNS] for row in rows], DOWNSTREAM_COLUMNS)
        for place, key in enumerate(DOWNSTREAM_KEYS):
            frame.insert(place, key, pd.Series([row[0][place] for row in rows], dtype="str"))
        frame["reference"] = pd.Series([row[1]["reference"] for row in rows], dtype="str")
        return frame

    @functools.cached_property
    def per_token(self) -> pd.DataFrame:
        """Tidy: one row per (window, position, condition) with the target token and its NLL (Parquet's exact
        float32 values when present, else the CSV's 6 decimals)."""
        import pandas as pd

        parquet, csv = self.folder / PER_TOKEN_PARQUET, self.folder / PER_TOKEN_CSV
        path = parquet if parquet.is_file() and _has_pyarrow() else csv
        if not path.is_file():
            raise UserError(f"no {PER_TOKEN_CSV} in {self.folder}")
        check_binding(
            per_token_binding(path), audit_binding(self.audit), str(path), f"the {AUDIT_FILE} beside it", RERUN_AUDIT
        )
        with reading(f"{path} cannot be read"):  # truncated gzip / Parquet, wrong bytes: the same to the user
            wide = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        conditions = [c for c in wide.columns if c not in PER_TOKEN_KEYS]
        if list(wide.columns[:3]) != PER_TOKEN_KEYS or set(conditions) != set(self.audit["conditions"]):
            raise UserError(f"{path} does not hold this audit's conditions ({', '.join(map(str, wide.columns))})")
        tidy = wide.melt(id_vars=PER_TOKEN_KEYS, value_vars=conditions, var_name="condition", value_name="nll")
        return tidy.astype(
            {
                "window": "int64",
                "position": "int64",
                "target_token": "int64",
                "nll": "float64",
                "condition": pd.CategoricalDtype(conditions),
            }
        )


class AuditCollection:
    """Several audits: each DataFrame of ``AuditResults`` concatenated, with ``model`` and ``arch`` columns."""

    def __init__(self, audits: list[AuditResults]):
        self.audits = audits

    def __repr__(self) -> str:
        return f"<AuditCollection of {len(self.audits)}: {', '.join(a.name for a in self.audits)}>"

    def _concat(self, name: str):
        import pandas as pd

        frames = [getattr(a, name) for a in self.audits]
        if all(f is None for f in frames):
            return None
        frames = [f.assign(model=a.name, arch=a.model["arch"]) for a, f in zip(self.audits, frames) if f is not None]
        frame = pd.concat(frames, ignore_index=True)
        if name == "per_token":  # the conditions' order of the first audit, then any new ones
            frame["condition"] = frame["condition"].astype(
                pd.CategoricalDtype(list(dict.fromkeys(c for f in frames for c in f["condition"].cat.categories)))
            )
        return frame[["model", "arch", *(c for c in frame.columns if c not in ("model", "arch"))]]

    conditions = property(lambda self: self._concat("conditions"))
    retention = property(lambda self: self._concat("retention"))
    variance = property(lambda self: self._concat("variance"))
    execution = property(lambda self: self._concat("execution"))
    per_layer = property(lambda self: self._concat("per_layer"))
    downstream = property(lambda self: self._concat("downstream"))
    per_token = property(lambda self: self._concat("per_token"))

    @property
    def overview(self) -> pd.DataFrame:
        """One row per audit (``audit``: its folder's name), the dashboard's overview table: the headline figures
        and the three verdicts in short form."""
        return overview_table([a.audit for a in self.audits], [a.folder.name for a in self.audits])


def load_audit(path: str | Path) -> AuditResults:
    """An audit folder (or its ``audit.json``) as DataFrames: ``.conditions``, ``.retention``, ``.variance``,
    ``.execution``, ``.per_layer`` (when swept), ``.downstream`` (``fca eval``), ``.per_token`` (read lazily); ``.model``, ``.data``,
    ``.settings``, ``.verdicts`` as in ``audit.json``."""
    return AuditResults(path)


def load_audits(paths: str | Path | Iterable[str | Path]) -> AuditCollection:
    """Several audits: a list of folders / ``audit.json`` paths, or one folder holding audit folders (e.g. a
    ``fca reproduce`` run's ``audits/``) or being one."""
    if isinstance(paths, (str, Path)):
        folder = Path(paths)
        if (folder / AUDIT_FILE).is_file() or folder.suffix == ".json":
            paths = [folder]
        else:
            paths = sorted(p.parent for p in folder.glob(f"*/{AUDIT_FILE}"))
            if not paths:
                raise UserError(f"no audit folders (*/{AUDIT_FILE}) in {folder}")
    return AuditCollection([load_audit(p) for p in paths])


def _frame(rows, key: str, columns: list[str]):
    """A table keyed by a text column ``key``, the other columns float64 (``None`` → NaN)."""
    frame = _numbers([row[1:] for row in rows], columns)
    frame.insert(0, key, [row[0] for row in rows])
    return frame.astype({key: "str"})


def _numbers(rows, columns: list[str]):
    import pandas as pd

    return pd.DataFrame([[np.nan if v is None else v for v in row] for row in rows], columns=columns, dtype="float64")
