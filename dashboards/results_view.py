"""The dashboard's results view: the finished audits of ``--results DIR`` and one of them in full.

Presentation only: entries, tables and files come from ``fca_workbench.dashboard.results_folder`` (which reads
nothing outside the results folder and builds every table with ``tables.py``); this module lays them out and
offers each table as CSV and the audit as ``audit.json`` (``pn.widgets.FileDownload``).
"""

from __future__ import annotations

import asyncio
import functools
import html
import io
from collections.abc import Callable
from typing import Any

import panel as pn
import views

from fca_workbench import tables
from fca_workbench.dashboard.downstream import downstream_tables
from fca_workbench.dashboard.escaping import markdown_text
from fca_workbench.dashboard.results_folder import AUDIT_FILE, AuditEntry, ResultsFolder, SizedCache, audit_tables
from fca_workbench.errors import UserError, first_line

RENDERED_BYTES = 64 << 20  # the tables (HTML and CSV text) and figures kept rendered, per process
_RENDERED = SizedCache(RENDERED_BYTES)


def rendered(entry: AuditEntry) -> tuple[list, dict | None]:
    """An audit's tables as (name, caption, HTML, CSV) and its per-layer figure, made once per version of its
    audit.json and shared by the sessions of the process."""
    kept = _RENDERED.get(entry.version)
    if kept is not None:
        return kept
    made = audit_tables(entry.valid_audit) + downstream_tables(entry.folder)
    parts = [
        (
            t.attrs["name"],
            t.attrs["caption"],
            tables.readable(t).to_html(index=False, escape=True, border=0),
            tables.to_csv(t),
        )
        for t in made
    ]
    per_layer = next((t for t in made if t.attrs["name"] == "per_layer"), None)
    figure = (
        None
        if per_layer is None
        else views.per_layer_heatmap(
            per_layer, f"{entry.model_name}: ΔNLL vs correct, each condition at one layer alone"
        )
    )
    size = sum(len(table_html) + len(csv) for _, _, table_html, csv in parts)
    _RENDERED.put(entry.version, (parts, figure), size + (0 if per_layer is None else 64 * len(per_layer)))
    return parts, figure


class ResultsView:
    """The list of audits (with a message for each one that cannot be shown) and the selected audit."""

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
        self.refresh = pn.widgets.Button(name="Look for new audits", css_classes=["fca-refresh"])
        self.problems = pn.pane.HTML("", css_classes=["fca-results-problems"])
        self.message = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["fca-results-message"])
        self.header = pn.pane.HTML("", css_classes=["fca-results-header"])
        self.heatmap = views.FigurePane(None, css_classes=["fca-results-per-layer"], visible=False)
        self.downloads = pn.FlexBox(css_classes=["fca-downloads"])
        self.tables = pn.Column(css_classes=["fca-results-tables"])
        self.select.param.watch(lambda event: self.later(self.show), "value")
        self.refresh.on_click(lambda event: self.later(self.rescan))
        self.layout = pn.Column(
            pn.Row(self.select, self.refresh),
            self.problems,
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
        shown = {entry.label: entry.name for entry in entries if entry.audit is not None}
        current = self.select.value
        self.select.options = shown
        self.select.value = current if current in shown.values() else next(iter(shown.values()), None)
        problems = [entry for entry in entries if entry.audit is None]
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
            f"<li class='fca-results-problem' data-entry='{html.escape(entry.name)}'>"
            f"<b>{html.escape(entry.name)}</b>: {html.escape(entry.problem or '')}</li>"
            for entry in problems
        )
        self.problems.object = f"<div class='fca-results-note'>{note}</div>" + (f"<ul>{items}</ul>" if items else "")
        self.show()

    def choose(self, name: object) -> str | None:
        """Show the audit called ``name`` (from a link); a message when there is none such."""
        if name in self.select.options.values():
            self.select.value = name
            return None
        return f"the link's audit={str(name)[:60]!r} is not an audit of the results folder; showing the first one"

    def activate(self) -> None:
        """The view is shown: draw the selected audit from now on."""
        if not self.active:
            self.active = True
            self.show()

    def show(self) -> None:
        """Draw the selected audit (once the view is shown) and tell the app, which keeps the URL in step."""
        if self.active:
            self.draw(self.select.value)
        if self.on_change is not None:
            self.on_change()

    def draw(self, name: str | None) -> None:
        self.message.visible = False
        if name is None or self.results is None:
            self.header.object = ""
            self.downloads.objects, self.tables.objects = [], []
            self.heatmap.object, self.heatmap.visible = None, False
            return
        try:
            self.render(self.results.entry(name))
        except UserError as exc:
            self.show_error(str(exc))
        except Exception as exc:  # an audit the tables cannot be made of is that audit's message, never a blank page
            self.show_error(f"{name}: cannot be shown: {first_line(exc)}")

    def show_error(self, message: str) -> None:
        self.message.object = markdown_text(message)
        self.message.visible = True

    def render(self, entry: AuditEntry) -> None:
        audit = entry.valid_audit
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
        parts, figure = rendered(entry)
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
            downloads.append(
                pn.widgets.FileDownload(
                    callback=functools.partial(text_bytes, csv),
                    filename=f"{name}.csv",
                    label=f"{name}.csv",
                    css_classes=[f"fca-download-{name}"],
                    sizing_mode="fixed",
                    width=230,
                    height=38,
                )
            )
            panes.append(
                pn.pane.HTML(
                    f"<div class='fca-table-{name}'><h4>{html.escape(caption)}</h4>{table_html}</div>",
                    css_classes=["fca-results-table"],
                )
            )
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


def text_bytes(text: str) -> io.BytesIO:
    return io.BytesIO(text.encode())


def scan(results: ResultsFolder | None) -> list[AuditEntry]:
    """The entries of the results folder now (none without one)."""
    return results.scan() if results is not None else []
