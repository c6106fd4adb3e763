"""A fix for Panel's queue of websocket writes, installed once per dashboard process (``app.configure``). It
lives with the Panel app: the view model (``fca_workbench.viewmodel``) never imports Panel.

While a write of a session is still in flight, Panel (1.9.4) queues that session's next document changes in
``panel.io.document._WRITE_MSGS`` and starts a task, ``_dispatch_msgs``, which sends them while
``_WRITE_BLOCK`` marks the session busy. When the task before it ends between the queueing and the new task's
start, it lifts the mark; the new task then finds no mark, returns, and the changes stay queued until the
session changes again: the browser keeps showing the view before. Under load this left 9 of 2,219 quick
results-view picks of 10-12 sessions unshown (issue 12). Fixed here: a task that finds changes queued and no
mark sets the mark and sends them.

Holding the document in each callback instead (so that Bokeh sends the changes) also fixed it, at a cost: one
message per change, 22% more server CPU per update in ``benchmarks/bench_dashboard.py``'s load run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import panel.io.document as panel_document

QUEUE = ("_dispatch_msgs", "_WRITE_MSGS", "_WRITE_BLOCK")  # the parts of Panel this fix relies on


def sends_stranded_changes(
    dispatch: Callable[[Any], Coroutine[Any, Any, Any]],
) -> Callable[[Any], Coroutine[Any, Any, Any]]:
    """``dispatch`` (Panel's ``_dispatch_msgs``) that also sends changes queued after the write block was lifted."""

    @functools.wraps(dispatch)
    async def dispatch_queued(doc: Any) -> Any:
        if doc not in panel_document._WRITE_BLOCK and panel_document._WRITE_MSGS.get(doc):
            panel_document._WRITE_BLOCK[doc] = True
        return await dispatch(doc)

    dispatch_queued.sends_stranded_changes = True  # type: ignore[attr-defined]  # the mark of an installed fix
    return dispatch_queued


def fix_stranded_writes() -> bool:
    """Install the fix (once; later calls do nothing); False when this Panel has no such queue to fix."""
    if not all(hasattr(panel_document, name) for name in QUEUE):
        return False
    if not getattr(panel_document._dispatch_msgs, "sends_stranded_changes", False):
        panel_document._dispatch_msgs = sends_stranded_changes(panel_document._dispatch_msgs)
    return True
