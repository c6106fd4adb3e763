"""The FCA dashboard: pick a checkpoint, a text window, a layer and an intervention; watch per-token ΔNLL
and the coefficient heatmaps (the live replay view); browse and download the finished audits of the results
folder (the results view). The selection lives in the URL, so a view is a link to share.

Serve it with ``fca dashboard [--port P] [--address A] [--registry FILE] [--results DIR]`` or

    panel serve dashboards/app.py --args --registry FILE

(docs/guides/dashboard.md: serving it to a lab group). This file serves; ``page.py`` builds one session's
widgets and layouts and wires them to the view model, ``fca_workbench.viewmodel``, where every number comes
from (the core's interventions, prefix cache and metrics), and with it what a link may select (``links``),
the order of a session's updates (``session``) and the server's settings (``serving``).

Per process: each checkpoint is loaded once (``fca_workbench.viewmodel.MODELS``) and shared read-only by
every session, and unloaded when no session has used it for ``--model-idle-seconds``; forwards on it run in a
worker thread under the checkpoint's lock, so the server keeps answering other sessions while one computes.
At most ``--max-sessions`` sessions are connected at once (a request that never opens the websocket takes no
place); one more gets a page saying the server is full. Per session: a bounded prefix store and result cache,
freed when the session ends.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, also when not run by ``panel serve``

import panel as pn
import results_view
import tornado.httputil
import tornado.routing
import tornado.web
from page import DashboardApp
from panel_writes import fix_stranded_writes

from fca_workbench.foundation.errors import UserError
from fca_workbench.viewmodel import (
    MODELS,
    SESSIONS,
    release_memory,
    unload_idle_models,
)
from fca_workbench.viewmodel.escaping import markdown_text
from fca_workbench.viewmodel.server import Server
from fca_workbench.viewmodel.server import configure as configure_process
from fca_workbench.viewmodel.serving import ServedHosts, ServedSettings, served_settings
from fca_workbench.viewmodel.session_updates import Document

pn.extension("plotly", "tabulator", sizing_mode="stretch_width", notifications=False)


def server_full_page() -> pn.pane.Alert:
    return pn.pane.Alert(
        f"The FCA dashboard is full: {SESSIONS.maximum} sessions are open, the most this server takes at once. "
        "Please try again in a few minutes; closing a dashboard tab you no longer use frees its place.",
        alert_type="warning",
        css_classes=["fca-server-full"],
    )


class SessionPage:
    """One session's page. It takes a place under ``--max-sessions`` only once its browser has connected and
    rendered it (Panel's ``onload``), so requests that never open the websocket lock nobody out; past the cap
    it says the server is full. The results folder is read in a worker thread, then the app is built inside
    the session's document; everything the session holds is freed when it ends."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.document = Document(pn.state.curdoc)
        self.layout = pn.Column(pn.pane.HTML("<i>Starting the FCA dashboard…</i>", css_classes=["fca-starting"]))
        self.admitted = self.ended = False
        self.app: DashboardApp | None = None
        pn.state.on_session_destroyed(self.destroyed)
        pn.state.onload(self.connected)

    async def connected(self) -> None:
        if not SESSIONS.admit():
            await self.document.call(self.show, server_full_page())
            return
        self.admitted = True
        entries = await asyncio.to_thread(results_view.scan, self.server.results)
        if not self.ended:
            await self.document.call(self.build, entries)

    def build(self, entries: list) -> None:
        try:
            self.app = DashboardApp(self.server, entries)
        except UserError as exc:
            self.show(pn.pane.Alert(markdown_text(exc), alert_type="danger", css_classes=["fca-message"]))
            return
        self.show(self.app.layout)

    def show(self, page: pn.viewable.Viewable) -> None:
        self.layout.objects = [page]

    def destroyed(self, session_context: object) -> None:
        self.ended = True
        if self.admitted:
            SESSIONS.leave()
        if self.app is not None:
            self.app.close()
        release_memory()


def create_app(server: Server) -> pn.viewable.Viewable:
    """One session's page (``SessionPage``); the process's idle models are unloaded on a schedule."""
    if MODELS.idle_seconds:  # idempotent: scheduled once per process
        period = datetime.timedelta(seconds=max(1.0, min(60.0, MODELS.idle_seconds / 4)))
        pn.state.schedule_task("fca-unload-idle-models", unload_idle_models, period=period)
    return SessionPage(server).layout


def configure(settings: ServedSettings) -> Server:
    """The process's ``Server`` for ``settings`` (``server.configure``), with the fix of Panel's write queue
    (``panel_writes``) installed."""
    fix_stranded_writes()
    return configure_process(settings)


class ForeignHost(tornado.routing.Matcher):
    """Matches a request whose ``Host`` is not a name the server is served as (``ServedHosts``)."""

    def __init__(self, hosts: ServedHosts) -> None:
        self.hosts = hosts

    def match(self, request: tornado.httputil.HTTPServerRequest) -> dict | None:
        return None if self.hosts.allows(request.host) else {}


class RefusedHost(tornado.web.RequestHandler):
    """403 for every method, websocket upgrades included, before any session or page is made."""

    def prepare(self) -> None:
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish("403: this dashboard answers only to the names it is served as (fca dashboard --allow-host NAME)\n")


def refuse_foreign_hosts(server: Any, hosts: ServedHosts) -> None:
    """Answer a request for any other ``Host`` with 403 (a DNS-rebinding page gets neither the app nor its
    websocket): a rule ahead of every route of the server's Tornado application (``server._tornado``, as
    Panel itself reaches it)."""
    application = getattr(server, "_tornado", None)
    if not isinstance(application, tornado.web.Application):
        raise UserError("this Bokeh server has no Tornado application to check Host headers on; refusing to serve")
    router = application.default_router
    router.rules.insert(0, router.process_rule(tornado.routing.Rule(ForeignHost(hosts), [(r".*", RefusedHost)])))


def serve(
    settings: ServedSettings,
    port: int = 5006,
    address: str = "127.0.0.1",
    show: bool = False,
    hosts: ServedHosts | None = None,
    on_ready: Callable[[], None] | None = None,
    **kwargs: Any,
) -> Any:
    """Serve the app (blocking), answering only the ``hosts`` it is served as (default: those of ``address``).
    ``kwargs`` go to ``pn.serve`` (websocket_origin, basic_auth, cookie_secret, num_threads, ...). The default
    checkpoint is found before the first session; closed sessions are cleaned up within ~10 s. ``on_ready`` is
    called once the server answers (its first turn of the event loop, the port listening)."""
    hosts = hosts or ServedHosts.of(address)
    kwargs.setdefault("websocket_origin", hosts.websocket_origins(port))
    server = configure(settings)
    server.default_checkpoint()

    def session_app() -> pn.viewable.Viewable:
        return create_app(server)

    if kwargs.get("num_threads") is not None:
        pn.config.nthreads = kwargs.pop("num_threads")  # type: ignore[misc]  # set through config's __setattr__
    kwargs.pop("num_threads", None)
    kwargs.setdefault("check_unused_sessions", 5000)
    kwargs.setdefault("unused_session_lifetime", 5000)
    served = pn.serve(
        {"/": session_app},
        port=port,
        address=address,
        show=show,
        title="FCA dashboard",
        admin=False,
        start=False,
        **kwargs,
    )
    refuse_foreign_hosts(served, hosts)
    served.start()
    if on_ready is not None:
        served.io_loop.add_callback(on_ready)
    served.io_loop.start()
    return served


if __name__.startswith("bokeh"):  # ``panel serve dashboards/app.py [--args ...]``: runs once per session
    try:
        create_app(configure(served_settings(sys.argv[1:]))).servable(title="FCA dashboard")
    except UserError as exc:
        pn.pane.Alert(markdown_text(exc), alert_type="danger").servable(title="FCA dashboard")
