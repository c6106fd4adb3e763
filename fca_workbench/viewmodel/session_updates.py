"""One dashboard session's update protocol, without widgets: how a change of the live view becomes a shown
result while many sessions share one server.

- ``Document``: changes of the page go through the session's Bokeh document as next-tick callbacks, which
  Bokeh applies (and sends) under the document's lock; the computing between them runs in worker threads
  holding nothing. Outside a server (a test, a notebook) each call just runs.
- ``Updates``: every update gets a generation; only the newest one may show its result (an update that a newer
  one overtook drops what it computed), the model is released whatever happens, a ``UserError`` is shown as
  its message and any other exception as an internal error that leaves the session working.
- ``LiveReplay``: what one update computes: the ``Analysis`` of a ``links.Selection``, and the audit with a
  per-layer sweep of the model shown.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from fca_workbench.foundation.errors import UserError, internal_error
from fca_workbench.viewmodel.links import Selection
from fca_workbench.viewmodel.live import Analysis, DashboardSession, SharedModel
from fca_workbench.viewmodel.pool import MODELS
from fca_workbench.viewmodel.results_folder import AuditEntry, ResultsFolder, per_layer_audit

log = logging.getLogger("fca.dashboard")
DOCUMENT_WAIT_SECONDS = 600  # a callback the document has not run by then belongs to a session that went away


class Document:
    """The session's document as the update protocol uses it (``doc``: Bokeh's, None outside a server)."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc

    @property
    def served(self) -> bool:
        return self.doc is not None and self.doc.session_context is not None

    def later(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` as a next-tick callback of the document, or now when not served."""
        if self.served:
            self.doc.add_next_tick_callback(fn)
        else:
            fn()

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` as a next-tick callback of the document and wait for its result (or exception);
        ``asyncio.TimeoutError`` when the document never runs it."""
        if not self.served:
            return fn(*args)
        future = asyncio.get_running_loop().create_future()

        def callback() -> None:
            if future.done():
                return
            try:
                future.set_result(fn(*args))
            except Exception as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)

        self.doc.add_next_tick_callback(callback)
        return await asyncio.wait_for(future, timeout=DOCUMENT_WAIT_SECONDS)


class LiveView(Protocol):
    """What the app does at each step of an update (the steps run inside the document unless said otherwise)."""

    def set_loading(self, value: bool) -> None: ...

    def checkpoint_name(self) -> str:
        """The checkpoint chosen (read at the start of the update, outside the document)."""
        ...

    def sync_and_query(self, model: SharedModel) -> Selection:
        """Fit the choices to ``model`` (and apply a pending link); the selection to compute."""
        ...

    def compute(self, selection: Selection, model: SharedModel) -> Analysis:
        """The analysis (in a worker thread)."""
        ...

    def finish(self, started: float, analysis: Analysis | None, message: str | None) -> None:
        """Show the analysis, or the message; called for the newest update only."""
        ...


class Updates:
    """The generations of one session's updates (see the module's docstring)."""

    def __init__(
        self,
        document: Document,
        acquire: Callable[[str], SharedModel],
        release: Callable[[SharedModel], None] = MODELS.release,
    ) -> None:
        self.document, self.acquire, self.release = document, acquire, release
        self.generation = 0

    async def run(self, view: LiveView) -> None:
        """One update of ``view``: load the model, fit the choices, compute, show (unless overtaken)."""
        self.generation += 1
        generation = self.generation
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            await self.document.call(view.set_loading, True)
            model = await loop.run_in_executor(None, self.acquire, view.checkpoint_name())
            try:
                if generation != self.generation:
                    return
                selection = await self.document.call(view.sync_and_query, model)
                analysis = await loop.run_in_executor(None, view.compute, selection, model)
            finally:
                self.release(model)
            await self.document.call(self._finish, view, generation, started, analysis, None)
        except UserError as exc:
            await self.document.call(self._finish, view, generation, started, None, str(exc))
        except asyncio.TimeoutError:  # the session went away while computing
            return
        except Exception as exc:  # a bug must not take the server (or this session) down: report and carry on
            log.error("dashboard update failed:\n%s", traceback.format_exc())
            await self.document.call(self._finish, view, generation, started, None, internal_error(exc))

    def _finish(
        self, view: LiveView, generation: int, started: float, analysis: Analysis | None, message: str | None
    ) -> None:
        if generation == self.generation:  # checked inside the document: a newer update may have begun meanwhile
            view.finish(started, analysis, message)


class LiveReplay:
    """One session's live replay: its ``DashboardSession`` (bounded caches) and, per model shown, the newest
    audit of it with a per-layer sweep in the results folder (looked up once per loaded model)."""

    def __init__(self, results: ResultsFolder | None = None) -> None:
        self.results = results
        self.session = DashboardSession()
        MODELS.attach(self.session)  # told to drop its prefix caches of a model that is unloaded
        self._audit: tuple[int | None, AuditEntry | None] = (None, None)  # (model serial, its audit)

    @property
    def audit(self) -> AuditEntry | None:
        """The per-layer audit of the model last computed on (None: none, or no results folder)."""
        return self._audit[1]

    def compute(self, selection: Selection, model: SharedModel) -> Analysis:
        """The analysis of ``selection`` on ``model``; a ``UserError`` for anything the user can fix."""
        text = selection.text_input(model)
        seed = selection.checked_seed()
        if self.results is not None and self._audit[0] != model.serial:
            self._audit = (model.serial, per_layer_audit(self.results, model))
        return self.session.analyse(
            selection.checkpoint,
            model,
            text,
            selection.condition,
            selection.replay_layer,
            seed,
            selection.chosen_donor,
        )

    def close(self) -> None:
        self.session.close()
