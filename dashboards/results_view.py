"""The dashboard's results view: the finished audits of ``--results DIR``, first all of them in one table
(``overview_view``), then the one picked in full, and beside it a second one to compare (``compare_view``).

Presentation only: entries, tables and files come from ``fca_workbench.viewmodel.results_folder`` (which reads
nothing outside the results folder and builds every table with ``tables.py``), the overview from
``dashboard.overview``, the comparison from ``dashboard.compare``; this module lays them out and offers each
table as CSV and the audit as ``audit.json`` (``pn.widgets.FileDownload``).
"""

from __future__ import annotations

import asyncio
import functools
import html
import io
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import panel as pn
import views
from compare_view import CompareView
from overview_view import OverviewView

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.notebooks import tables
from fca_workbench.viewmodel.compare import comparison
from fca_workbench.viewmodel.downloads import download_csv
from fca_workbench.viewmodel.downstream import downstream_tables, downstream_version
from fca_workbench.viewmodel.escaping import markdown_text
from fca_workbench.viewmodel.query import choose
from fca_workbench.viewmodel.results_folder import (
    AUDIT_FILE,
    AuditEntry,
    ResultsFolder,
    audit_tables,
    byte_bounded_cache,
    keep,
    kept,
)
from fca_workbench.viewmodel.results_overview import chosen_sort, overview_of

NONE = ""  # the audit choices' value for "no audit": the overview alone, or nothing to compare with
RENDERED_BYTES = 64 << 20  # the tables (HTML and CSV text) and figures kept rendered, per process
_RENDERED = byte_bounded_cache(RENDERED_BYTES)
_RENDERED_LOCK = threading.Lock()


def rendered(entry: AuditEntry, audit: dict) -> tuple[list, dict | None]:
    """An audit's tables as (name, caption, HTML, CSV) and its per-layer figure, made once per version of its
    audit.json and downstream.json and shared by the sessions of the process (``audit``: the entry's whole audit,
    ``ResultsFolder.full``)."""
    version = (entry.version, downstream_version(entry.folder))
    shown = kept(_RENDERED, _RENDERED_LOCK, version)
    if shown is not None:
        return shown
    made = audit_tables(audit) + downstream_tables(entry.folder, audit)
    parts = [
        (
            t.attrs["name"],
            t.attrs["caption"],
            tables.readable(t).to_html(index=False, escape=True, border=0),
            download_csv(t),
        )
        for t in made
    ]
    per_layer = next((t for t in made if t.attrs["name"] == "per_layer"), None)
    figure = (
        None
        if per_layer is None
        else views.per_layer_heatmap(
            per_layer, f"{entry.model_name}: ΔNLL vs correct, each condition at one decoder layer's controllers alone"
        )
    )
    size = sum(len(table_html) + len(csv) for _, _, table_html, csv in parts)
    keep(_RENDERED, _RENDERED_LOCK, version, (parts, figure), size + (0 if per_layer is None else 64 * len(per_layer)))
    return parts, figure


class ResultsView:
    """The overview of the audits (with a message for each one that cannot be shown), the selected audit and
    the comparison with a second one."""

    def __init__(
        self,
        results: ResultsFolder | None,
        on_change: Callable[[], None] | None = None,
        later: Callable[[Callable[[], Any]], None] = lambda fn: fn(),
        entries: list[AuditEntry] | None = None,
    ) -> None:
        """``entries``: the folder's scan, made by the caller off the event loop (None: scanned here)."""
        self.results = results  # a ResultsFolder, or None when the server has no results folder
        self.on_change = on_change  # called after the shown audit changed (the app puts it in the URL)
        self.later = later  # runs a change of the page inside the session's document (the app's ``later``)
        self.active = False  # the audit is drawn once the view is shown (most sessions never open it)
        self.select = pn.widgets.Select(name="Audit", options={}, css_classes=["fca-audit"])
        self.compare = pn.widgets.Select(name="Compare with", options={}, css_classes=["fca-compare-with"])
        self.overview = OverviewView(self.pick, self.publish, later)
        self.comparison = CompareView()
        self.refresh = pn.widgets.Button(name="Look for new audits", css_classes=["fca-refresh"])
        self.problems = pn.pane.HTML("", css_classes=["fca-results-problems"])
        self.message = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["fca-results-message"])
        self.header = pn.pane.HTML("", css_classes=["fca-results-header"])
        self.heatmap = views.FigurePane(None, css_classes=["fca-results-per-layer"], visible=False)
        self.downloads = pn.FlexBox(css_classes=["fca-downloads"])
        self.tables = pn.Column(css_classes=["fca-results-tables"])
        self.select.param.watch(lambda event: self.later(self.show), "value")
        self.compare.param.watch(lambda event: self.later(self.show), "value")
        self.refresh.on_click(lambda event: self.later(self.rescan))
        self.layout = pn.Column(
            self.problems,
            self.overview.layout,
            pn.Row(self.select, self.compare, self.refresh),
            self.comparison.layout,
            self.message,
            self.header,
            self.downloads,
            self.heatmap,
            self.tables,
        )
        self.show_entries(scan(self.results) if entries is None else entries)

    async def rescan(self) -> None:
        """Look for new audits, reading the files in a worker thread (a large or broken audit.json never holds
        up the server), then list them."""
        self.show_entries(await asyncio.to_thread(scan, self.results))

    def show_entries(self, entries: list[AuditEntry]) -> None:
        """List these audits; keep the selection if it is still there."""
        self.summary = overview_of(entries)
        listed = set(self.summary.names)
        shown = {entry.label: entry.name for entry in entries if entry.name in listed}
        for select, none in ((self.select, "— none: the overview only —"), (self.compare, "— none —")):
            current = select.value
            select.options = {none: NONE, **shown}
            select.value = current if current in shown.values() else NONE
        if self.results is None:
            note = "This server has no results folder (fca dashboard --results DIR)."
        elif not entries:
            note = (
                f"No audit.json under the results folder '{html.escape(self.results.root.name)}' yet: "
                "fca audit, fca audit-many and fca reproduce write there."
            )
        else:
            note = f"{len(shown)} audit(s) in the results folder '{html.escape(self.results.root.name)}'."
        items = "".join(
            f"<li class='fca-results-problem' data-entry='{html.escape(name)}'>"
            f"<b>{html.escape(name)}</b>: {html.escape(problem)}</li>"
            for name, problem in self.summary.problems
        )
        self.problems.object = f"<div class='fca-results-note'>{note}</div>" + (f"<ul>{items}</ul>" if items else "")
        if self.active:
            self.overview.show(self.summary, self.results.root if self.results else Path("results"))
        self.show()

    def apply_link(self, requested: dict) -> list[str]:
        """Show what a link names (audit, compare, sort, order), each checked; a note for each that is not there."""
        names = [value for value in self.select.options.values() if value != NONE]
        notes = []
        for select, key in ((self.select, "audit"), (self.compare, "compare")):
            select.value, note = choose(requested, key, names, NONE, "is not an audit of the results folder")
            notes += [note.rsplit("; showing", 1)[0] + "; showing none"] if note else []
        sort, sort_notes = chosen_sort(requested)
        self.overview.apply(sort)
        return notes + sort_notes

    def link(self) -> dict:
        """The view's values of ``query.ViewQuery`` (the URL): the audit shown, the one compared, the sort."""
        return {"audit": self.select.value or None, "compare": self.compare.value or None, **self.overview.link()}

    def pick(self, name: str) -> None:
        """A row of the overview was clicked: show that audit in full."""
        self.select.value = name

    def activate(self) -> None:
        """The view is shown: draw the overview and the selected audit from now on."""
        if not self.active:
            self.active = True
            self.overview.show(self.summary, self.results.root if self.results else Path("results"))
            self.show()

    def show(self) -> None:
        """Draw the selected audit and the comparison (once the view is shown) and tell the app, which keeps the
        URL in step."""
        if self.active:
            self.draw(self.select.value)
            self.draw_comparison(self.select.value, self.compare.value)
            self.overview.mark(self.select.value)
        self.publish()

    def publish(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def draw_comparison(self, first: str, second: str) -> None:
        if not first or not second or self.results is None:
            self.comparison.clear()
            return
        try:
            a, b = (self.results.full(self.results.entry(name)) for name in (first, second))
            self.comparison.show(comparison(a, b, (first, second)))
        except UserError as exc:
            self.comparison.refuse(str(exc))
        except Exception as exc:  # a pair the tables cannot be made of is its message, never a blank page
            self.comparison.refuse(f"{first} vs {second}: cannot be compared: {first_line(exc)}")

    def draw(self, name: str | None) -> None:
        self.message.visible = False
        if not name or self.results is None:
            self.header.object = ""
            self.downloads.objects, self.tables.objects = [], []
            self.heatmap.object, self.heatmap.visible = None, False
            return
        try:
            entry = self.results.entry(name)
            self.render(entry, self.results.full(entry))
        except UserError as exc:
            self.show_error(str(exc))
        except Exception as exc:  # an audit the tables cannot be made of is that audit's message, never a blank page
            self.show_error(f"{name}: cannot be shown: {first_line(exc)}")

    def show_error(self, message: str) -> None:
        self.message.object = markdown_text(message)
        self.message.visible = True

    def render(self, entry: AuditEntry, audit: dict) -> None:
        settings, data = audit["settings"], audit["data"]["eval"]
        rows = [
            ("model", f"{entry.model_name} ({audit['model']['arch']}, {audit['model']['params']:,} parameters)"),
            ("eval data", f"{data['windows']} windows of {data['window']} tokens"),
            ("seed, resamples", f"{settings.get('seed')}, {settings.get('resamples')}"),
            ("per-layer sweep", settings.get("per_layer_mode") or "not run"),
        ]
        rows += [(f"verdict: {key.replace('_', ' ')}", text) for key, text in audit["verdict"].items()]
        body = "".join(
            f"<tr><th style='text-align:left;padding-right:12px;vertical-align:top'>{html.escape(k)}</th>"
            f"<td>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        self.header.object = f"<h3 class='fca-results-title'>{html.escape(entry.name)}</h3><table>{body}</table>"
        parts, figure = rendered(entry, audit)
        downloads = [
            pn.widgets.FileDownload(
                callback=functools.partial(self.audit_bytes, entry),
                filename=AUDIT_FILE,
                label=AUDIT_FILE,
                button_type="primary",
                css_classes=["fca-download-audit"],
                sizing_mode="fixed",
                width=230,
                height=38,
            )
        ]
        panes = []
        for name, caption, table_html, csv in parts:
            downloads.append(views.csv_download(name, csv))
            panes.append(views.table_pane(name, caption, table_html))
        self.downloads.objects = downloads
        self.tables.objects = panes
        self.heatmap.object = figure
        self.heatmap.visible = figure is not None

    def audit_bytes(self, entry: AuditEntry) -> io.BytesIO | None:
        """audit.json as it is on disk now (read again, links refused again)."""
        if self.results is None:  # no results folder: no entries to download
            return None
        try:
            return io.BytesIO(self.results.download(entry, AUDIT_FILE))
        except UserError as exc:
            self.show_error(str(exc))
            return None


def scan(results: ResultsFolder | None) -> list[AuditEntry]:
    """The entries of the results folder now (none without one)."""
    return results.scan() if results is not None else []
