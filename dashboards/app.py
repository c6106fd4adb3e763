"""The FCA dashboard: pick a checkpoint, a text window, a layer and an intervention; watch per-token ΔNLL
and the coefficient heatmaps (the live replay view); browse and download the finished audits of the results
folder (the results view). The selection lives in the URL, so a view is a link to share.

Serve it with ``fca dashboard [--port P] [--address A] [--registry FILE] [--results DIR]`` or

    panel serve dashboards/app.py --args --registry FILE

(see README, "Dashboard", for serving it to a lab group). This file only presents: every number comes from
``fca_workbench.dashboard`` (which uses the core's interventions, prefix cache and metrics).

Per process: each checkpoint is loaded once (``fca_workbench.dashboard.MODELS``) and shared read-only by
every session, and unloaded when no session has used it for ``--model-idle-seconds``; forwards on it run in a
worker thread under the checkpoint's lock, so the server keeps answering other sessions while one computes.
At most ``--max-sessions`` sessions are open at once; one more gets a page saying the server is full. Per
session: a bounded prefix store and result cache, freed when the session ends.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import html
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import panel as pn
import torch

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # ``panel serve`` runs this file once per session
    sys.path.insert(0, HERE)
import views  # noqa: E402  (the sibling presentation modules)
from results_view import ResultsView  # noqa: E402

from fca_workbench.dashboard import (  # noqa: E402
    CONDITION_HELP,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MODEL_IDLE_SECONDS,
    MAX_PASTE_CHARS,
    MODELS,
    SEEDED,
    SESSIONS,
    DashboardSession,
    Registry,
    SharedModel,
    load_registry,
    pasted_input,
    release_memory,
    unload_idle_models,
    window_input,
)
from fca_workbench.dashboard.panel_writes import fix_stranded_writes  # noqa: E402
from fca_workbench.dashboard.query import AUDIT_DONOR, QUERY_NAMES, VIEWS, ViewQuery, choose, choose_index  # noqa: E402
from fca_workbench.dashboard.results_folder import ResultsFolder, per_layer_audit  # noqa: E402
from fca_workbench.errors import UserError  # noqa: E402
from fca_workbench.results.audit_tables import per_layer_table  # noqa: E402
from fca_workbench.results.conditions import CONDITIONS

log = logging.getLogger("fca.dashboard")
pn.extension("plotly", sizing_mode="stretch_width", notifications=False)

SETTINGS = {"registry": None, "calibration_windows": None, "results": None}
SOURCES = ("eval window", "pasted text")
LINK_SOURCES = dict(zip(SOURCES, ("window", "text")))  # how the URL names them
ALL_LAYERS = -1
MAX_SEED = 2**31 - 1


def acquire_model(registry: Registry, name: str) -> SharedModel:
    """The process-wide model of checkpoint ``name`` (loaded once, shared read-only by all sessions), in use
    until ``MODELS.release``."""
    folder = registry.folder(name)
    try:
        return MODELS.acquire(folder, calibration_windows=SETTINGS["calibration_windows"], results=SETTINGS["results"])
    except UserError as exc:  # name the checkpoint, never the server's folder
        raise UserError(f"checkpoint '{name}' cannot be used: " + str(exc).replace(str(folder), f"'{name}'")) from None


class DashboardApp:
    def __init__(self, registry: Registry, results: ResultsFolder | None = None):
        self.registry = registry
        self.results = results
        self.session = DashboardSession()
        MODELS.attach(self.session)  # told to drop its prefix caches of a model that is unloaded
        self.generation = 0
        self.updates = 0
        self.syncing = False
        self.pending = {}  # widget changes asked for by watchers, applied by ``sync_and_query``
        self.analysis = None
        self.doc = pn.state.curdoc  # this session's document (None outside a server)
        # the URL's selection: read once here, checked against what the server has, then kept in step with the view
        self.link = ViewQuery()
        if self.served:
            pn.state.location.sync(self.link, QUERY_NAMES)
        self.pending_link = self.link.requested()  # applied to the live widgets once the model is known
        self.link_notes = []
        self.live_audit = (None, None)  # (model serial, its newest audit with a per-layer sweep)
        names = registry.names
        default = (
            "featuregate-s0" if "featuregate-s0" in names else next((n for n in names if "featuregate" in n), names[0])
        )
        initial, note = choose(self.pending_link, "checkpoint", names, default, "is not a checkpoint of this server")
        self.link_notes += [note] if note else []

        self.checkpoint = pn.widgets.Select(
            name="Checkpoint", options=names, value=initial, css_classes=["fca-checkpoint"]
        )
        self.source = pn.widgets.RadioButtonGroup(
            name="Text", options=list(SOURCES), value=SOURCES[0], css_classes=["fca-source"]
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
            name="Layer", options={"all layers": ALL_LAYERS}, value=ALL_LAYERS, css_classes=["fca-layer"]
        )
        self.condition = pn.widgets.Select(
            name="Intervention", options=list(CONDITIONS), value="token_shuffle", css_classes=["fca-condition"]
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
            name="Heatmap layer (slot × position)", options={"layer 0": 0}, value=0, css_classes=["fca-heat-layer"]
        )

        self.alert = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["fca-message"])
        self.status = pn.pane.HTML("starting…", css_classes=["fca-status"])
        self.summary = pn.pane.HTML("", css_classes=["fca-summary-pane"])
        self.tokens = pn.pane.HTML("", css_classes=["fca-token-pane"])
        self.delta_plot = views.FigurePane(None, css_classes=["fca-delta"], height=440)
        self.layer_heat = views.FigurePane(None, css_classes=["fca-layer-heat"])
        self.slot_heat = views.FigurePane(None, css_classes=["fca-slot-heat"])
        self.heat_note = pn.pane.HTML("", css_classes=["fca-heat-note"])
        self.live_per_layer = views.FigurePane(None, css_classes=["fca-live-per-layer"], visible=False)
        self.live_per_layer_entry = None
        self.link_alert = pn.pane.Alert("", alert_type="warning", visible=False, css_classes=["fca-link-message"])
        self.results_view = ResultsView(results, on_change=self.publish, later=self.later)

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
            pn.layout.Divider(),
            self.heat_slot,
            self.heat_layer,
            min_width=300,
            max_width=340,
        )
        self.main = pn.Column(
            self.alert,
            self.status,
            self.summary,
            self.tokens,
            self.delta_plot,
            self.heat_note,
            self.layer_heat,
            self.slot_heat,
            self.live_per_layer,
        )
        view, note = choose(self.pending_link, "view", VIEWS, VIEWS[0], "is not a view (live, results)")
        if "audit" in self.pending_link:
            note = note or self.results_view.choose(self.pending_link["audit"])
        self.link_notes += [note] if note else []
        self.tabs = pn.Tabs(
            ("Live replay", pn.Row(sidebar, self.main)),
            ("Finished audits", self.results_view.layout),
            active=VIEWS.index(view),
            dynamic=False,
            css_classes=["fca-tabs"],
        )
        if view == "results":
            self.results_view.activate()
        self.tabs.param.watch(lambda event: self.later(self.on_tab), "active")
        self.layout = pn.Column(self.link_alert, self.tabs)
        pn.state.onload(self.first_update)

    @property
    def served(self) -> bool:
        return self.doc is not None and self.doc.session_context is not None

    # ------------------------------------------------------------------ events

    async def first_update(self):
        await self.update()

    # Watchers change no widget themselves: Panel handles browser events outside the document lock, and a
    # change sent from there can interleave on the websocket with a locked update's message. They note what
    # to change; ``sync_and_query`` applies it inside the document (see ``in_document``).

    def on_change(self, event):
        # A plain (not async) watcher: param calls it at once, so ``set_quietly`` really silences it.
        if self.syncing:
            return
        if event.obj is self.layer and event.new != ALL_LAYERS:
            self.pending["heat_layer"] = event.new
        pn.state.execute(self.update)

    def on_tab(self):
        if VIEWS[self.tabs.active] == "results":
            self.results_view.activate()
        self.publish()

    def later(self, fn):
        """Run ``fn`` as a next-tick callback of the document (see ``in_document``), or now when not served."""
        if self.served:
            self.doc.add_next_tick_callback(fn)
        else:
            fn()

    def on_analyse_text(self, event):
        self.pending["source"] = SOURCES[1]
        pn.state.execute(self.update)

    def set_quietly(self, widget, attribute, value):
        self.syncing = True
        try:
            setattr(widget, attribute, value)
        finally:
            self.syncing = False

    # ------------------------------------------------------------------ computing

    def query(self) -> dict:
        layer = self.layer.value
        donor = self.donor.value
        return {
            "name": self.checkpoint.value,
            "source": self.source.value,
            "window": self.window.value,
            "text": self.text.value,
            "condition": self.condition.value,
            "layer": None if layer in (None, ALL_LAYERS) else int(layer),
            "seed": self.seed.value,
            "donor": None if donor is None or donor < 0 else int(donor),
        }

    def compute(self, query: dict, model: SharedModel):
        if query["source"] == SOURCES[1]:
            text = pasted_input(model, query["text"])
        else:
            text = window_input(model, query["window"])
        seed = query["seed"]
        if seed is None:
            raise UserError("seed is empty: enter a non-negative integer")
        if self.results is not None and self.live_audit[0] != model.serial:
            self.live_audit = (model.serial, per_layer_audit(self.results, model))
        return self.session.analyse(
            query["name"], model, text, query["condition"], query["layer"], int(seed), query["donor"]
        )

    async def in_document(self, fn, *args):
        """Run ``fn(*args)`` as a next-tick callback of this session's document and wait for it.

        Bokeh applies (and sends) document changes made in such callbacks under the document's lock, which
        keeps the updates of many concurrent sessions intact; the computing between them runs in worker
        threads without holding anything."""
        doc = self.doc
        if doc is None or doc.session_context is None:  # not served (e.g. built in a test): just run it
            return fn(*args)
        future = asyncio.get_running_loop().create_future()

        def callback():
            if future.done():
                return
            try:
                future.set_result(fn(*args))
            except Exception as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)

        doc.add_next_tick_callback(callback)
        return await asyncio.wait_for(future, timeout=600)

    async def update(self):
        self.generation += 1
        generation = self.generation
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            await self.in_document(self.set_loading, True)
            model = await loop.run_in_executor(None, acquire_model, self.registry, self.checkpoint.value)
            try:
                if generation != self.generation:
                    return
                query = await self.in_document(self.sync_and_query, model)
                analysis = await loop.run_in_executor(None, self.compute, query, model)
            finally:
                MODELS.release(model)
            await self.in_document(self.finish, generation, started, analysis, None)
        except UserError as exc:
            await self.in_document(self.finish, generation, started, None, str(exc))
        except asyncio.TimeoutError:  # the session went away while computing
            return
        except Exception as exc:  # a bug must not take the server (or this session) down: report and carry on
            log.error("dashboard update failed:\n%s", traceback.format_exc())
            message = f"internal error ({type(exc).__name__}: {exc}); the session keeps working"
            await self.in_document(self.finish, generation, started, None, message)

    def set_loading(self, value: bool):
        self.main.loading = value

    def sync_and_query(self, model: SharedModel) -> dict:
        if "source" in self.pending:
            self.set_quietly(self.source, "value", self.pending.pop("source"))
        self.sync_widgets(model)
        if self.pending_link is not None:
            self.apply_link(model)
            self.sync_widgets(model)
        if "heat_layer" in self.pending:
            layer = self.pending.pop("heat_layer")
            if layer in self.heat_layer.options.values():
                self.set_quietly(self.heat_layer, "value", layer)
        return self.query()

    def finish(self, generation: int, started: float, analysis, message):
        """Show the result (or the message) of update ``generation``, unless a newer update is under way."""
        if generation != self.generation:
            return
        self.main.loading = False
        if message is not None:
            self.show_error(message, started)
        else:
            self.render(analysis, started)
        self.pending_link = None  # the link is applied (or was left for a checkpoint that failed to load)
        self.link_alert.object = "".join(
            f"<div class='fca-link-note'>{html.escape(note)}</div>" for note in self.link_notes
        )
        self.link_alert.visible = bool(self.link_notes)
        self.publish()

    def apply_link(self, model: SharedModel):
        """Put the link's selection into the live widgets, each value checked against this checkpoint; a value
        that does not fit leaves the default and a note."""
        requested, self.pending_link = self.pending_link, None
        last_window, last_layer = len(model.eval_windows) - 1, model.num_layers - 1
        slots = list(self.heat_slot.options)
        source, note = choose(
            requested, "source", LINK_SOURCES.values(), "window", "is not a text source (window, text)"
        )
        if source == "text":
            note = "the link was to pasted text, which a link does not carry; showing an eval window instead"
        if requested.get("layer") == "all":
            requested = {k: v for k, v in requested.items() if k != "layer"}
        chosen = [
            (self.window, choose_index(requested, "window", 0, last_window, 0)),
            (self.layer, choose_index(requested, "layer", 0, last_layer, ALL_LAYERS, "all layers")),
            (
                self.condition,
                choose(
                    requested,
                    "condition",
                    model.conditions,
                    self.condition.value,
                    "is not an intervention of this checkpoint",
                ),
            ),
            (self.seed, choose_index(requested, "seed", 0, MAX_SEED, 0)),
            (self.donor, choose_index(requested, "donor", AUDIT_DONOR, last_window, AUDIT_DONOR, "the audit's donor")),
            (self.heat_layer, choose_index(requested, "heat_layer", 0, last_layer, 0)),
        ]
        if slots:
            chosen.append(
                (self.heat_slot, choose(requested, "heat_slot", slots, slots[0], "is not a slot of this checkpoint"))
            )
        self.link_notes += [note] if note else []
        for widget, (value, note) in chosen:
            self.set_quietly(widget, "value", value)
            self.link_notes += [note] if note else []

    def publish(self):
        """Write the view's selection into the URL (not before the link it was opened with is applied)."""
        if self.pending_link is not None:
            return
        layer = self.layer.value
        self.link.param.update(
            view=VIEWS[self.tabs.active],
            checkpoint=self.checkpoint.value,
            source=LINK_SOURCES[self.source.value],
            window=self.window.value,
            layer="all" if layer in (None, ALL_LAYERS) else int(layer),
            condition=self.condition.value,
            seed=self.seed.value,
            donor=self.donor.value,
            heat_slot=self.heat_slot.value,
            heat_layer=self.heat_layer.value,
            audit=self.results_view.select.value,
        )

    def sync_widgets(self, model: SharedModel):
        """Fit the layer, window and heatmap choices to the checkpoint, without triggering updates."""
        layers = {"all layers": ALL_LAYERS, **{f"layer {i}": i for i in range(model.num_layers)}}
        if self.layer.options != layers:
            value = self.layer.value if self.layer.value in layers.values() else ALL_LAYERS
            self.set_quietly(self.layer, "options", layers)
            self.set_quietly(self.layer, "value", value)
        heat_layers = {f"layer {i}": i for i in range(model.num_layers)}
        if self.heat_layer.options != heat_layers:
            self.set_quietly(self.heat_layer, "options", heat_layers)
            self.set_quietly(self.heat_layer, "value", min(max(self.heat_layer.value or 0, 0), model.num_layers - 1))
        slots = model.all_slot_labels() if model.has_coefficients else []
        if self.heat_slot.options != slots:
            value = self.heat_slot.value if self.heat_slot.value in slots else (slots[0] if slots else None)
            self.set_quietly(self.heat_slot, "options", slots)
            self.set_quietly(self.heat_slot, "value", value)
        last = len(model.eval_windows) - 1
        if self.window.end != last:
            self.set_quietly(self.window, "end", last)
            self.window.name = f"Eval window (0–{last}, {model.window} tokens each)"
        self.set_quietly(self.window, "disabled", self.source.value != SOURCES[0])
        if list(self.condition.options) != list(model.conditions):  # routers add layer_mean_topk
            value = self.condition.value if self.condition.value in model.conditions else "token_shuffle"
            self.set_quietly(self.condition, "options", list(model.conditions))
            self.set_quietly(self.condition, "value", value)
        seeded = self.condition.value in SEEDED
        self.set_quietly(self.seed, "disabled", not seeded)
        self.set_quietly(self.donor, "disabled", self.condition.value != "cross_input")
        self.condition_help.object = html.escape(CONDITION_HELP[self.condition.value])

    def show_error(self, message: str, started: float):
        self.updates += 1
        self.alert.object = html.escape(message)
        self.alert.visible = True
        self.status.object = (
            f"<span class='fca-update' data-update='{self.updates}' data-state='error'>"
            f"update #{self.updates}: not computed ({(time.perf_counter() - started) * 1000:.0f} ms): "
            f"<span class='fca-error'>{html.escape(message)}</span></span>"
            + (" <i>(the views below are from the last successful update)</i>" if self.analysis else "")
        )

    def render(self, analysis, started: float):
        self.analysis = analysis
        self.updates += 1
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
        self.show_live_audit(self.live_audit[1])
        elapsed = (time.perf_counter() - started) * 1000
        self.status.object = (
            f"<span class='fca-update' data-update='{self.updates}' data-state='ok'>"
            f"update #{self.updates}: {elapsed:.0f} ms (compute {analysis.compute_ms:.0f} ms)</span>"
        )

    def show_live_audit(self, entry):
        """The per-layer heatmap of the checkpoint's audit (drawn again only when the audit shown changes)."""
        if entry is self.live_per_layer_entry:
            return
        self.live_per_layer_entry = entry
        self.live_per_layer.object = (
            None
            if entry is None
            else views.per_layer_heatmap(
                per_layer_table([entry.audit]),
                f"Per-layer sweep of this checkpoint, from audit '{entry.name}': "
                "ΔNLL vs correct, each condition at one layer alone (over that audit's eval windows)",
            )
        )
        self.live_per_layer.visible = entry is not None

    def close(self):
        self.session.close()
        self.analysis = None
        for pane in (self.delta_plot, self.layer_heat, self.slot_heat):
            pane.object = None


def server_full_page():
    return pn.pane.Alert(
        f"The FCA dashboard is full: {SESSIONS.maximum} sessions are open, the most this server takes at once. "
        "Please try again in a few minutes; closing a dashboard tab you no longer use frees its place.",
        alert_type="warning",
        css_classes=["fca-server-full"],
    )


def create_app(registry: Registry | None = None):
    """One session's app, or the polite "server is full" page past ``--max-sessions``; frees that session's
    memory when the session ends."""
    if not SESSIONS.admit():
        return server_full_page()
    app = None

    def destroyed(session_context):
        SESSIONS.leave()
        if app is not None:
            app.close()
        release_memory()

    pn.state.on_session_destroyed(destroyed)
    if MODELS.idle_seconds:  # idempotent: scheduled once per process
        period = datetime.timedelta(seconds=max(1.0, min(60.0, MODELS.idle_seconds / 4)))
        pn.state.schedule_task("fca-unload-idle-models", unload_idle_models, period=period)
    app = DashboardApp(registry or SETTINGS["registry"] or load_registry(), SETTINGS["results"])
    return app.layout


def configure(
    registry=None,
    calibration_windows=None,
    torch_threads=1,
    max_sessions=DEFAULT_MAX_SESSIONS,
    model_idle_seconds=DEFAULT_MODEL_IDLE_SECONDS,
    results="results",
) -> Registry:
    """Process settings: the registry (None: the shipped checkpoints), calibration windows for the static
    profiles (None: all), torch threads (1 keeps small models fast when several sessions share the CPU), the
    most sessions open at once, the idle time after which a model is unloaded (0: no limit, never) and the
    results folder whose audits the results view lists (None: none). Installs the fix of Panel's write queue
    (``fca_workbench.dashboard.panel_writes``)."""
    fix_stranded_writes()
    SETTINGS["registry"] = load_registry(registry)
    SETTINGS["calibration_windows"] = calibration_windows
    SETTINGS["results"] = ResultsFolder(results) if results else None
    SESSIONS.maximum = max_sessions
    MODELS.idle_seconds = model_idle_seconds
    if torch_threads:
        torch.set_num_threads(torch_threads)
    return SETTINGS["registry"]


def serve(
    port=5006,
    address="127.0.0.1",
    registry=None,
    calibration_windows=None,
    torch_threads=1,
    max_sessions=DEFAULT_MAX_SESSIONS,
    model_idle_seconds=DEFAULT_MODEL_IDLE_SECONDS,
    results="results",
    show=False,
    **kwargs,
):
    """Serve the app (blocking). ``kwargs`` go to ``pn.serve`` (websocket_origin, basic_auth, cookie_secret,
    num_threads, ...). Closed sessions are cleaned up within ~10 s."""
    configure(registry, calibration_windows, torch_threads, max_sessions, model_idle_seconds, results)
    if kwargs.get("num_threads") is not None:
        pn.config.nthreads = kwargs.pop("num_threads")
    kwargs.pop("num_threads", None)
    kwargs.setdefault("check_unused_sessions", 5000)
    kwargs.setdefault("unused_session_lifetime", 5000)
    return pn.serve(
        {"/": create_app}, port=port, address=address, show=show, title="FCA dashboard", admin=False, **kwargs
    )


def _served_settings(argv):
    parser = argparse.ArgumentParser(prog="panel serve dashboards/app.py --args")
    parser.add_argument("--registry", default=os.environ.get("FCA_REGISTRY"))
    parser.add_argument("--calibration-windows", type=int, default=os.environ.get("FCA_CALIBRATION_WINDOWS"))
    parser.add_argument("--torch-threads", type=int, default=int(os.environ.get("FCA_TORCH_THREADS", "1")))
    parser.add_argument(
        "--max-sessions", type=int, default=int(os.environ.get("FCA_MAX_SESSIONS", DEFAULT_MAX_SESSIONS))
    )
    parser.add_argument(
        "--model-idle-seconds",
        type=float,
        default=float(os.environ.get("FCA_MODEL_IDLE_SECONDS", DEFAULT_MODEL_IDLE_SECONDS)),
    )
    parser.add_argument("--results", default=os.environ.get("FCA_RESULTS", "results"))
    args, _ = parser.parse_known_args(argv)
    return args


if __name__.startswith("bokeh"):  # ``panel serve dashboards/app.py [--args ...]``: runs once per session
    try:
        if SETTINGS["registry"] is None:
            _args = _served_settings(sys.argv[1:])
            _calibration = int(_args.calibration_windows) if _args.calibration_windows else None
            configure(
                _args.registry,
                _calibration,
                _args.torch_threads,
                _args.max_sessions,
                _args.model_idle_seconds,
                _args.results,
            )
        create_app().servable(title="FCA dashboard")
    except UserError as exc:
        pn.pane.Alert(html.escape(str(exc)), alert_type="danger").servable(title="FCA dashboard")
