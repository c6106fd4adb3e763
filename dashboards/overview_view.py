"""The results view's overview: every audit of the results folder in one sortable table, its CSV and the Python
that gives a notebook the same DataFrame, and figures across audits by configuration (the seeds of one model config and training settings).

Presentation only: the table, its order and the figures' numbers come from ``fca_workbench.viewmodel.results_overview``.
Sorting is chosen with the two widgets above the table (so the order is in the URL); a click on a row calls
``on_pick`` with that audit's name.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import panel as pn
import views

from fca_workbench.viewmodel.results_overview import DEFAULT_SORT, ORDERS, SORT_KEYS, Overview, notebook_snippet


class OverviewView:
    """The overview's widgets; ``show(overview)`` draws a scan, ``on_change`` is called when the order changes."""

    def __init__(
        self,
        on_pick: Callable[[str], None],
        on_change: Callable[[], None],
        later: Callable[[Callable[[], Any]], None] = lambda fn: fn(),
    ) -> None:
        """``later``: runs a change of the page inside the session's document (the app's ``later``)."""
        self.on_pick, self.on_change = on_pick, on_change
        self.overview: Overview | None = None
        self.order_shown: list[str] = []  # the audits' names in the order the table shows them
        self.marked: str | None = None  # the audit shown in detail, whose row is highlighted
        self.sort = pn.widgets.Select(name="Sort by", options=SORT_KEYS, value=DEFAULT_SORT, css_classes=["fca-sort"])
        self.order = pn.widgets.RadioButtonGroup(
            name="Order", options=list(ORDERS), value=ORDERS[0], css_classes=["fca-order"]
        )
        self.table = pn.widgets.Tabulator(
            None,
            show_index=False,
            selectable=1,
            disabled=True,
            layout="fit_data",  # the table as wide as the page, scrolling sideways when its columns are wider
            configuration={"columnDefaults": {"headerSort": False}},  # sorted by the widgets above, kept in the URL
            css_classes=["fca-overview"],
            max_height=520,
        )
        self.download = pn.widgets.FileDownload(
            callback=self.csv_bytes,
            filename="overview.csv",
            label="overview.csv",
            button_type="primary",
            css_classes=["fca-download-overview"],
            sizing_mode="fixed",
            width=230,
            height=38,
        )
        self.snippet = pn.pane.HTML("", css_classes=["fca-overview-snippet"])
        self.retention = views.FigurePane(None, css_classes=["fca-overview-retention"], visible=False)
        self.delta = views.FigurePane(None, css_classes=["fca-overview-delta"], visible=False)
        self.unresolved = pn.pane.HTML(
            "<div>Gap retention: no static profile's retention resolves in these audits (the gap each would be a "
            "share of has a 95% CI that holds 0), so there is no percentage to draw.</div>",
            css_classes=["fca-overview-unresolved"],
            visible=False,
        )
        self.sort.param.watch(lambda event: later(self.redraw), "value")
        self.order.param.watch(lambda event: later(self.redraw), "value")
        self.table.param.watch(lambda event: later(self.picked), "selection")
        self.layout = pn.Column(
            pn.Row(self.sort, self.order),
            self.table,
            pn.Row(self.download, self.snippet),
            self.unresolved,
            pn.Row(self.retention, self.delta),
            css_classes=["fca-overview-section"],
        )

    def show(self, overview: Overview, root: Path) -> None:
        self.overview = overview
        self.snippet.object = (
            "<div style='font-size:0.85em'>The same table in a notebook:</div>"
            f"<pre class='fca-snippet'>{html.escape(notebook_snippet(root, overview.names))}</pre>"
        )
        self.retention.object = views.bars_figure(
            overview.retention_bars(),
            "Static profiles: gap retention by configuration (ratio of means over the seeds of one configuration, 95% CI; unresolved left out)",
            "retention",
            percent=True,
        )
        self.delta.object = views.bars_figure(
            overview.delta_bars(),
            "ΔNLL vs correct by condition and configuration (mean ± sd over the seeds of one configuration)",
            "ΔNLL (nats)",
        )
        self.retention.visible = self.retention.object is not None
        self.delta.visible = self.delta.object is not None
        self.unresolved.visible = self.delta.visible and not self.retention.visible  # controllers, but no figure
        self.redraw()

    def redraw(self) -> None:
        """The table in the chosen order; then tell the app (the order is in the URL)."""
        if self.overview is not None:
            self.order_shown = list(self.overview.sorted(self.sort.value, self.order.value)["audit"])
            shown = self.overview.readable(self.sort.value, self.order.value)
            self.table.formatters = {column: {"type": "plaintext"} for column in shown.columns}  # text, never HTML
            self.table.value = shown
            self.mark(self.marked)
        self.on_change()

    def mark(self, name: str | None) -> None:
        """Highlight the row of the audit shown in detail (none: no row)."""
        self.marked = name
        wanted = [self.order_shown.index(name)] if name in self.order_shown else []
        if self.table.selection != wanted:
            self.table.selection = wanted

    def picked(self) -> None:
        rows = self.table.selection
        if rows and rows[0] < len(self.order_shown):
            self.on_pick(self.order_shown[rows[0]])

    def csv_bytes(self) -> io.BytesIO:
        """The table's exact values in the order shown (``Overview.csv``)."""
        text = "" if self.overview is None else self.overview.csv(self.sort.value, self.order.value)
        return io.BytesIO(text.encode())

    def link(self) -> dict:
        return {"sort": self.sort.value, "order": self.order.value}

    def apply(self, sort: tuple[str, str]) -> None:
        self.sort.value, self.order.value = sort
