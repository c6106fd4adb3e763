"""One session's page of the FCA dashboard: the live replay view and the results view, their widgets and
layouts, wired to the view model (``fca_workbench.viewmodel``) where every number comes from.

Served by ``app.py`` (``fca dashboard`` or ``panel serve dashboards/app.py``), once per browser session.
"""

from __future__ import annotations

import html
import time
from typing import Any

import panel as pn
import param
import views
from results_view import ResultsView

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.audit_tables import per_layer_table
from fca_workbench.results.conditions import model_conditions
from fca_workbench.viewmodel import (
    MAX_PASTE_CHARS,
    Analysis,
    SharedModel,
)
from fca_workbench.viewmodel.escaping import markdown_text
from fca_workbench.viewmodel.links import (
    DEFAULT_CONDITION,
    TEXT_SOURCE,
    WINDOW_SOURCE,
    Selection,
    fitted,
    heat_controller,
    link_of,
    linked,
    opening_checkpoint,
    opening_view,
)
from fca_workbench.viewmodel.query import ALL_LAYERS, ALL_LAYERS_LABEL, QUERY_NAMES, SOURCES, VIEWS, ViewQuery
from fca_workbench.viewmodel.results_folder import AuditEntry
from fca_workbench.viewmodel.server import Server
from fca_workbench.viewmodel.session_updates import Document, LiveReplay, Updates

PROGRESS_AFTER_SECONDS = 1.0  # an update still working after this shows its stage
PROGRESS_PERIOD_MS = 500  # how often the stage shown is refreshed


class DashboardApp:
    """One session's page: the live replay view and the results view, their selection kept in the URL."""

    def __init__(self, server: Server, entries: list[AuditEntry] | None = None) -> None:
        """``entries``: the results folder's scan, made off the event loop by the caller (None: scanned here)."""
        self.server = server
        self.replay = LiveReplay(server.results)
        self.document = Document(pn.state.curdoc)  # this session's document (None outside a server)
        self.updates = Updates(self.document, server.acquire, server.release)
        self.shown = 0  # updates shown, numbered on the page (``data-update``)
        self.syncing = False
        self.pending: dict = {}  # widget changes asked for by watchers, applied by ``sync_and_query``
        self.analysis: Analysis | None = None
        # the URL's selection: read once here, checked against what the server has, then kept in step with the view
        self.link = ViewQuery()
        location = pn.state.location
        if self.document.served and location is not None:
            location.sync(self.link, QUERY_NAMES)
        self.pending_link: dict | None = self.link.requested()  # applied to the live widgets once the model is known
        self.link_notes: list[str] = []
        names = server.registry.names
        initial, note = opening_checkpoint(self.pending_link, names, server.default_checkpoint())
        self.link_notes += [note] if note else []

        self.checkpoint = pn.widgets.Select(
            name="Checkpoint", options=names, value=initial, css_classes=["fca-checkpoint"]
        )
        self.source = pn.widgets.RadioButtonGroup(
            name="Text", options=list(SOURCES), value=WINDOW_SOURCE, css_classes=["fca-source"]
        )
        self.window = pn.widgets.IntInput(name="Eval window", value=0, start=0, step=1, css_classes=["fca-window"])
        self.text = pn.widgets.TextAreaInput(
            name=f"Pasted text (at most {MAX_PASTE_CHARS:,} characters)",
            description="Scored up to one eval window of tokens; longer text is cut with a note.",
            placeholder="Paste any text, then press 'Analyse pasted text'",
            max_length=MAX_PASTE_CHARS * 5,
            height=110,
            css_classes=["fca-text"],
        )
        self.analyse_text = pn.widgets.Button(
            name="Analyse pasted text", button_type="primary", css_classes=["fca-analyse"]
        )
        self.layer = pn.widgets.Select(
            name="Intervene at (layer, or one controller)",
            options={ALL_LAYERS_LABEL: ALL_LAYERS},
            value=ALL_LAYERS,
            css_classes=["fca-layer"],
        )
        self.condition = pn.widgets.Select(
            name="Intervention",
            options=list(model_conditions(routed=False)),
            value=DEFAULT_CONDITION,
            css_classes=["fca-condition"],
        )
        self.condition_help = pn.pane.HTML(
            "", css_classes=["fca-condition-help"], styles={"font-size": "0.85em", "color": "#555"}
        )
        self.seed = pn.widgets.IntInput(
            name="Seed",
            value=0,
            start=0,
            css_classes=["fca-seed"],
            description="Seeds the cross_input derangement and the token_shuffle permutation.",
        )
        self.donor = pn.widgets.IntInput(
            name="Donor window (cross_input)",
            value=-1,
            start=-1,
            css_classes=["fca-donor"],
            description="-1: the donor the audit's seeded derangement gives this window.",
        )
        self.heat_slot = pn.widgets.Select(
            name="Heatmap slot (layer × position)", options=[], css_classes=["fca-heat-slot"]
        )
        self.heat_layer = pn.widgets.Select(
            name="Heatmap controller (slot × position)",
            options={"layer 0": 0},
            value=0,
            css_classes=["fca-heat-layer"],
        )

        self.alert = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["fca-message"])
        self.status = pn.pane.HTML("starting…", css_classes=["fca-status"])  # the last update shown
        self.progress = pn.pane.HTML("", css_classes=["fca-progress-pane"], visible=False)  # the update under way
        self.computing_on: SharedModel | None = None  # the model the update under way computes on
        self.working_since: float | None = None
        self.ticker: Any = None  # the periodic callback that shows the update's stage while it works
        self.summary = pn.pane.HTML("", css_classes=["fca-summary-pane"])
        self.tokens = pn.pane.HTML("", css_classes=["fca-token-pane"])
        self.delta_plot = views.FigurePane(None, css_classes=["fca-delta"], height=440)
        self.layer_heat = views.FigurePane(None, css_classes=["fca-layer-heat"])
        self.slot_heat = views.FigurePane(None, css_classes=["fca-slot-heat"])
        self.heat_note = pn.pane.HTML("", css_classes=["fca-heat-note"])
        self.live_per_layer = views.FigurePane(None, css_classes=["fca-live-per-layer"], visible=False)
        self.live_per_layer_entry: AuditEntry | None = None
        self.link_alert = pn.pane.Alert("", alert_type="warning", visible=False, css_classes=["fca-link-message"])
        self.results_view = ResultsView(server.results, self.publish, self.document.later, entries)

        for widget in (
            self.checkpoint,
            self.source,
            self.window,
            self.layer,
            self.condition,
            self.seed,
            self.donor,
            self.heat_slot,
            self.heat_layer,
        ):
            widget.param.watch(self.on_change, "value")
        self.analyse_text.on_click(self.on_analyse_text)

        sidebar = pn.Column(
            pn.pane.HTML(
                "<h2 style='margin:0'>FCA dashboard</h2><div style='color:#555'>Frozen-Controller "
                "Auditing: replay the frozen model with reassigned coefficients</div>"
            ),
            self.checkpoint,
            self.source,
            self.window,
            self.text,
            self.analyse_text,
            self.layer,
            self.condition,
            self.condition_help,
            self.seed,
            self.donor,
            # a rule drawn here: Panel's Divider loads its stylesheet from a public CDN, which the page must not call
            pn.pane.HTML("<hr style='border:0;border-top:1px solid #ddd;margin:8px 0'>", css_classes=["fca-rule"]),
            self.heat_slot,
            self.heat_layer,
            min_width=300,
            max_width=340,
        )
        self.main = pn.Column(
            self.alert,
            self.summary,
            self.tokens,
            self.delta_plot,
            self.heat_note,
            self.layer_heat,
            self.slot_heat,
            self.live_per_layer,
        )
        view, note = opening_view(self.pending_link)
        self.link_notes += ([note] if note else []) + self.results_view.apply_link(self.pending_link)
        self.tabs = pn.Tabs(
            ("Live replay", pn.Row(sidebar, pn.Column(self.status, self.progress, self.main))),
            ("Finished audits", self.results_view.layout),
            active=VIEWS.index(view),
            dynamic=False,
            css_classes=["fca-tabs"],
        )
        if view == "results":
            self.results_view.activate()
        self.tabs.param.watch(lambda event: self.document.later(self.on_tab), "active")
        self.layout = pn.Column(self.link_alert, self.tabs)
        pn.state.onload(self.first_update)

    # ------------------------------------------------------------------ events

    async def first_update(self) -> None:
        await self.update()

    # Watchers change no widget themselves: Panel handles browser events outside the document lock, and a
    # change sent from there can interleave on the websocket with a locked update's message. They note what
    # to change; ``sync_and_query`` applies it inside the document (``session.Document``).

    def on_change(self, event: param.parameterized.Event) -> None:
        # A plain (not async) watcher: param calls it at once, so ``set_quietly`` really silences it.
        if self.syncing:
            return
        if event.obj is self.layer and event.new != ALL_LAYERS:
            self.pending["heat_layer"] = event.new
        pn.state.execute(self.update)

    def on_tab(self) -> None:
        if VIEWS[self.tabs.active] == "results":
            self.results_view.activate()
        self.publish()

    def on_analyse_text(self, event: object) -> None:
        self.pending["source"] = TEXT_SOURCE
        pn.state.execute(self.update)

    def set_quietly(self, widget: pn.widgets.Widget, attribute: str, value: Any) -> None:
        self.syncing = True
        try:
            setattr(widget, attribute, value)
        finally:
            self.syncing = False

    # ------------------------------------------------------------------ one update (``session.Updates``)

    async def update(self) -> None:
        await self.updates.run(self)

    def set_loading(self, value: bool) -> None:
        """Dim the views while an update works; its stage shows below the status line from ~1 s on (not
        dimmed), every half second, until it finishes."""
        self.main.loading = value
        self.working_since = time.perf_counter() if value else None
        if value and self.ticker is None and self.document.served:
            self.ticker = pn.state.add_periodic_callback(self.show_progress, period=PROGRESS_PERIOD_MS)
        if not value:
            self.stop_progress()

    def show_progress(self) -> None:
        if self.working_since is None:
            return self.stop_progress()
        elapsed = time.perf_counter() - self.working_since
        if elapsed < PROGRESS_AFTER_SECONDS:
            return None
        model = self.computing_on
        stage = model.stage if model is not None else None
        doing = stage or ("replaying" if model is not None else f"loading checkpoint {self.checkpoint.value}")
        self.progress.object = (
            f"<span class='fca-progress' data-stage='{html.escape(doing)}'>working for {elapsed:.0f} s: "
            f"{html.escape(doing)}…</span>"
        )
        self.progress.visible = True
        return None

    def stop_progress(self) -> None:
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        self.progress.visible = False
        self.progress.object = ""

    def checkpoint_name(self) -> str:
        return self.checkpoint.value

    def selection(self) -> Selection:
        return Selection(
            checkpoint=self.checkpoint.value,
            source=self.source.value,
            window=self.window.value,
            text=self.text.value,
            condition=self.condition.value,
            layer=self.layer.value,
            seed=self.seed.value,
            donor=self.donor.value,
        )

    def compute(self, selection: Selection, model: SharedModel) -> Analysis:
        return self.replay.compute(selection, model)

    def sync_and_query(self, model: SharedModel) -> Selection:
        self.computing_on = model
        if "source" in self.pending:
            self.set_quietly(self.source, "value", self.pending.pop("source"))
        self.sync_widgets(model)
        if self.pending_link is not None:
            self.apply_link(model)
            self.sync_widgets(model)
        if "heat_layer" in self.pending:
            chosen = heat_controller(model, self.pending.pop("heat_layer"))
            if chosen in self.heat_layer.options.values():
                self.set_quietly(self.heat_layer, "value", chosen)
        return self.selection()

    def finish(self, started: float, analysis: Analysis | None, message: str | None) -> None:
        """Show the result (or the message) of the newest update."""
        self.set_loading(False)
        self.computing_on = None
        if analysis is None:
            self.show_error(message or "", started)
        else:
            self.render(analysis, started)
        self.pending_link = None  # the link is applied (or was left for a checkpoint that failed to load)
        self.link_alert.object = "".join(markdown_text(note, "fca-link-note") for note in self.link_notes)
        self.link_alert.visible = bool(self.link_notes)
        self.publish()

    def apply_link(self, model: SharedModel) -> None:
        """Put the link's selection into the live widgets (``links.linked``: each value checked against this
        checkpoint; one that does not fit leaves the default and a note)."""
        requested, self.pending_link = self.pending_link or {}, None
        values, notes = linked(requested, model, list(self.heat_slot.options), self.condition.value)
        self.link_notes += notes
        for name, value in values.items():
            self.set_quietly(getattr(self, name), "value", value)

    def publish(self) -> None:
        """Write the view's selection into the URL (not before the link it was opened with is applied)."""
        if self.pending_link is not None:
            return
        results = self.results_view.link()
        values = link_of(
            VIEWS[self.tabs.active], self.selection(), self.heat_slot.value, self.heat_layer.value, results["audit"]
        )
        self.link.param.update(**{**values, **results})

    def sync_widgets(self, model: SharedModel) -> None:
        """Fit the layer, window and heatmap choices to the checkpoint (``links.fitted``), without triggering
        updates."""
        fit = fitted(
            model,
            self.layer.value,
            self.heat_layer.value,
            self.heat_slot.value,
            self.condition.value,
            self.source.value,
        )
        for widget, options, value in (
            (self.layer, fit.layers, fit.layer),
            (self.heat_layer, fit.heat_layers, fit.heat_layer),
            (self.heat_slot, fit.slots, fit.slot),
        ):
            if widget.options != options:
                self.set_quietly(widget, "options", options)
                self.set_quietly(widget, "value", value)
        if self.window.end != fit.last_window:
            self.set_quietly(self.window, "end", fit.last_window)
            self.window.name = fit.window_label
        self.set_quietly(self.window, "disabled", fit.window_disabled)
        if list(self.condition.options) != fit.conditions:
            self.set_quietly(self.condition, "options", fit.conditions)
            self.set_quietly(self.condition, "value", fit.condition)
        self.set_quietly(self.seed, "disabled", fit.seed_disabled)
        self.set_quietly(self.donor, "disabled", fit.donor_disabled)
        self.condition_help.object = html.escape(fit.condition_help)

    # ------------------------------------------------------------------ showing

    def show_error(self, message: str, started: float) -> None:
        self.shown += 1
        self.alert.object = markdown_text(message)
        self.alert.visible = True
        self.status.object = (
            f"<span class='fca-update' data-update='{self.shown}' data-state='error'>"
            f"update #{self.shown}: not computed ({(time.perf_counter() - started) * 1000:.0f} ms): "
            f"<span class='fca-error'>{html.escape(message)}</span></span>"
            + (" <i>(the views below are from the last successful update)</i>" if self.analysis else "")
        )

    def render(self, analysis: Analysis, started: float) -> None:
        self.analysis = analysis
        self.shown += 1
        self.alert.visible = False
        self.alert.object = ""
        self.summary.object = views.summary_html(analysis)
        self.tokens.object = views.token_html(analysis.tokens, analysis.delta)
        self.delta_plot.object = views.delta_figure(analysis)
        if analysis.coefficients_correct:
            self.heat_note.object = ""
            slot = self.heat_slot.value or analysis.all_slot_labels()[0]
            self.layer_heat.object = views.layer_heatmap(analysis, slot)
            self.slot_heat.object = views.slot_heatmap(analysis, int(self.heat_layer.value or 0))
            self.layer_heat.visible = self.slot_heat.visible = True
        else:
            self.heat_note.object = "<i>This model has no controller, so there are no coefficient heatmaps.</i>"
            self.layer_heat.visible = self.slot_heat.visible = False
        self.show_live_audit(self.replay.audit)
        elapsed = (time.perf_counter() - started) * 1000
        self.status.object = (
            f"<span class='fca-update' data-update='{self.shown}' data-state='ok'>"
            f"update #{self.shown}: {elapsed:.0f} ms (compute {analysis.compute_ms:.0f} ms)</span>"
        )

    def show_live_audit(self, entry: AuditEntry | None) -> None:
        """The per-layer heatmap of the checkpoint's audit (drawn again only when the audit shown changes; none
        when that audit cannot be read whole now)."""
        if entry is self.live_per_layer_entry:
            return
        self.live_per_layer_entry = entry
        figure = None
        if entry is not None and self.server.results is not None:
            try:
                sweep = per_layer_table([self.server.results.full(entry)])
            except UserError:
                sweep = None
            if sweep is not None:
                figure = views.per_layer_heatmap(
                    sweep,
                    f"Per-layer sweep of this checkpoint, from audit '{entry.name}': "
                    "ΔNLL vs correct, each condition at one decoder layer's controllers alone (over that audit's eval "
                    "windows)",
                )
        self.live_per_layer.object = figure
        self.live_per_layer.visible = figure is not None

    def close(self) -> None:
        self.replay.close()
        self.analysis = None
        for pane in (self.delta_plot, self.layer_heat, self.slot_heat):
            pane.object = None
