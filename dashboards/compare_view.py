"""Two audits side by side: what differs, their figures next to each other with the differences, both per-layer
heatmaps. Presentation only: ``fca_workbench.viewmodel.compare`` decides what can be compared and makes the
tables; a pair it refuses is its one-line message.
"""

from __future__ import annotations

import html

import panel as pn
import views

from fca_workbench.notebooks import tables
from fca_workbench.viewmodel.compare import Comparison
from fca_workbench.viewmodel.downloads import download_csv
from fca_workbench.viewmodel.escaping import markdown_text


class CompareView:
    """The comparison of the audit shown with a second one (hidden while none is picked)."""

    def __init__(self) -> None:
        self.message = pn.pane.Alert("", alert_type="warning", visible=False, css_classes=["fca-compare-message"])
        self.header = pn.pane.HTML("", css_classes=["fca-compare-header"])
        self.first = views.FigurePane(None, css_classes=["fca-compare-first"])
        self.second = views.FigurePane(None, css_classes=["fca-compare-second"])
        self.heatmaps = pn.Row(self.first, self.second, visible=False)
        self.downloads = pn.FlexBox(css_classes=["fca-compare-downloads"])
        self.tables = pn.Column(css_classes=["fca-compare-tables"])
        self.layout = pn.Column(
            self.message, self.header, self.downloads, self.heatmaps, self.tables, css_classes=["fca-compare"]
        )

    def clear(self) -> None:
        self.message.visible = False
        self.header.object = ""
        self.downloads.objects, self.tables.objects = [], []
        self.first.object = self.second.object = None
        self.heatmaps.visible = False

    def refuse(self, message: str) -> None:
        self.clear()
        self.message.object = markdown_text(message)
        self.message.visible = True

    def show(self, comparison: Comparison) -> None:
        self.clear()
        items = "".join(f"<li class='fca-compare-difference'>{html.escape(d)}</li>" for d in comparison.differences)
        self.header.object = (
            f"<h3 class='fca-compare-title'>{html.escape(comparison.first)} vs {html.escape(comparison.second)}</h3>"
            f"<ul>{items}</ul>"
        )
        downloads, panes = [], []
        for table in comparison.tables:
            name = table.attrs["name"]
            downloads.append(views.csv_download(name, download_csv(table)))
            body = tables.readable(table).to_html(index=False, escape=True, border=0)
            panes.append(views.table_pane(name, table.attrs["caption"], body))
        self.downloads.objects, self.tables.objects = downloads, panes
        if comparison.per_layer is not None:
            for pane, table, name in zip(
                (self.first, self.second), comparison.per_layer, (comparison.first, comparison.second)
            ):
                pane.object = views.per_layer_heatmap(
                    table, f"{name}: ΔNLL vs correct, each condition at one decoder layer"
                )
            self.heatmaps.visible = True
