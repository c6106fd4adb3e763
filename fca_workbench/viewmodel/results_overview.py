"""The results view's first screen: every audit of the results folder in one sortable table, and figures across
audits grouped by configuration (seeds of one model config and training settings, ``by_configuration``).

Every number comes from ``results``: the table is ``overview.overview_table`` (what ``load_audits(...).overview``
gives a notebook), the figures are ``audit_tables.seed_summary`` of each profile's retention and ``assignment_seed_table`` (what
``fca audit-many`` and the notebooks' ``*_over_seeds`` tables give: mean ± sd where several seeds of one
configuration are present). This module only orders, filters and names them; nothing here knows a widget.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from fca_workbench.foundation.errors import first_line
from fca_workbench.notebooks import tables
from fca_workbench.results.audit_tables import assignment_seed_table, by_configuration, with_controller
from fca_workbench.results.conditions import BASELINES, retention_profiles
from fca_workbench.results.inference import retention_over_seeds
from fca_workbench.results.overview import OVERVIEW_COLUMNS, overview_row, overview_table
from fca_workbench.viewmodel.downloads import download_csv
from fca_workbench.viewmodel.query import choose
from fca_workbench.viewmodel.results_folder import AuditEntry

if TYPE_CHECKING:
    import pandas as pd

ORDERS = ("ascending", "descending")
SORT_KEYS = {c.header: c.key for c in OVERVIEW_COLUMNS if c.form == "value"}  # the sort choice: header -> key
DEFAULT_SORT = "audit"


@dataclass(frozen=True)
class Bars:
    """One configuration's bars of a figure across audits: a mean ± sd (sd 0 for one seed) over ``n`` seeds, or,
    where ``low`` / ``high`` are given, the value with its 95% CI (a retention: the ratio of means)."""

    arch: str
    n: int
    x: list[str]
    mean: list[float]
    sd: list[float]
    low: list[float] | None = None
    high: list[float] | None = None


@dataclass(frozen=True)
class Overview:
    """The valid audits of a scan (``table``: one row each, in scan order), the entries that cannot be shown
    with their one-line problems, and the audits the figures average (one per model and eval windows)."""

    table: pd.DataFrame
    problems: list[tuple[str, str]]
    seed_audits: list[dict]

    @property
    def names(self) -> list[str]:
        return list(self.table["audit"])

    def sorted(self, key: str, order: str) -> pd.DataFrame:
        """The table sorted by the column ``key`` (missing values last), ties in scan order."""
        return self.table.sort_values(
            key, ascending=order == ORDERS[0], kind="stable", na_position="last", key=_sortable
        ).reset_index(drop=True)

    def readable(self, key: str, order: str) -> pd.DataFrame:
        """The sorted table as text to read (``tables.readable``: CIs as [lo, hi], shares as %, signed ΔNLL)."""
        ordered = self.sorted(key, order)
        ordered.attrs.update(self.table.attrs)
        return tables.readable(ordered)

    def csv(self, key: str, order: str) -> str:
        """The sorted table's exact values, as the download gives them (``downloads.download_csv``)."""
        return download_csv(self.sorted(key, order))

    def retention_bars(self) -> list[Bars]:
        """Gap retention of every static profile the audits of a configuration all have (``layer_mean_topk``
        for routers too), by configuration: over seeds the ratio of the mean numerator to the mean denominator with
        its bootstrap 95% CI (``inference.retention_over_seeds``; one seed: its audit's); a retention that does not
        resolve is left out, never drawn, and a configuration with none that resolves has no bars."""
        bars = []
        for arch, group in by_configuration(with_controller(self.seed_audits)).items():
            profiles = retention_profiles(set.intersection(*(set(audit["retention"]) for audit in group)))
            figures = [(p, retention_over_seeds([a["retention"][p] for a in group])) for p in profiles]
            shown = [(p, f) for p, f in figures if f["value"] is not None and None not in f["ci95"]]
            if not shown:
                continue
            bars.append(
                Bars(
                    arch,
                    len(group),
                    [p for p, _ in shown],
                    [float(f["value"]) for _, f in shown],
                    [0.0 for _ in shown],
                    [float(f["ci95"][0]) for _, f in shown],
                    [float(f["ci95"][1]) for _, f in shown],
                )
            )
        return bars

    def delta_bars(self) -> list[Bars]:
        """ΔNLL of each intervention against ``correct``, by configuration (``assignment_seed_table``)."""
        table = assignment_seed_table(self.seed_audits)
        bars = []
        for arch, group in table.groupby("arch", sort=False):
            rows = group[~group["condition"].isin(BASELINES)]  # every other condition intervenes
            bars.append(
                Bars(
                    str(arch),
                    int(rows["n"].iloc[0]),
                    list(rows["condition"]),
                    [float(v) for v in rows["delta_mean"]],
                    [float(v) for v in rows["delta_sd"]],
                )
            )
        return bars


def _sortable(column: pd.Series) -> pd.Series:
    return column.str.lower() if column.dtype == object or str(column.dtype) == "str" else column


def one_per_model(audits: list[dict]) -> list[dict]:
    """The first audit of each (model, eval windows) pair by fingerprint: an audit of the same checkpoint on the
    same windows again (a copy, ``fca reproduce`` after ``fca audit``) is not another seed."""
    seen, kept = set(), []
    for audit in audits:
        key = (audit["model"]["fingerprint"], audit["data"]["eval"].get("fingerprint"))
        if key not in seen:
            seen.add(key)
            kept.append(audit)
    return kept


def overview_of(entries: list[AuditEntry]) -> Overview:
    """The overview of a scan's entries (``ResultsFolder.scan``)."""
    valid, problems = [], []
    for entry in entries:
        problem = entry.problem if entry.audit is None else unsummarised(entry)
        if problem is None:
            valid.append(entry)
        else:
            problems.append((entry.name, problem))
    audits = [entry.valid_audit for entry in valid]
    return Overview(
        table=overview_table(audits, [entry.name for entry in valid]),
        problems=problems,
        seed_audits=one_per_model(audits),
    )


def unsummarised(entry: AuditEntry) -> str | None:
    """Why a valid entry has no overview row (a figure the schema leaves optional is missing), else None."""
    try:
        overview_row(entry.valid_audit, entry.name)
    except Exception as exc:  # one audit that cannot be summarised is its one-line note, never a blank overview
        return f"cannot be summarised: {first_line(exc)}"
    return None


def chosen_sort(requested: dict) -> tuple[tuple[str, str], list[str]]:
    """``((key, order), notes)``: a link's sort column and order, each checked (a bad value: the default, a note)."""
    key, key_note = choose(requested, "sort", SORT_KEYS.values(), DEFAULT_SORT, "is not a column of the overview")
    order, order_note = choose(requested, "order", ORDERS, ORDERS[0], f"is not an order ({', '.join(ORDERS)})")
    return (key, order), [note for note in (key_note, order_note) if note]


def snippet_folder(root: Path, start: Path) -> tuple[str, str]:
    """(the results folder as the snippet spells it, what that path is relative to): relative to ``start`` (the
    folder ``fca dashboard`` was started in) when the results folder lies inside it, else absolute."""
    root, start = root.resolve(), start.resolve()
    if root.is_relative_to(start):
        return root.relative_to(start).as_posix(), f"paths relative to {start}, where the dashboard was started"
    return root.as_posix(), "absolute paths on the dashboard's machine"


def notebook_snippet(root: Path, names: list[str], start: Path | None = None) -> str:
    """The Python that gives a notebook the same DataFrame (``audit``: each folder's name), its paths as
    ``snippet_folder`` spells them (``start``: the server's working folder by default), with a comment saying
    what they are relative to."""
    folder, relative_to = snippet_folder(root, Path.cwd() if start is None else start)
    listed = "".join(f"    {repr(str(PurePosixPath(folder, name)))},\n" for name in names)
    return f"from fca_workbench import load_audits\n\n# {relative_to}\naudits = load_audits([\n{listed}])\naudits.overview\n"
