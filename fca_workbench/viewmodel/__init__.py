"""The dashboard's view model: every number the Panel app (``dashboards/app.py``) shows comes from here, and
every rule of what it may show; the app only builds widgets and layouts. Nothing here imports Panel (the fix of
Panel's write queue, ``dashboards/panel_writes.py``, lives with the app).

- ``pool``: what the server process holds for every session (checkpoint registry, model pool, session cap);
- ``serving``: the server's settings (``fca dashboard`` and ``panel serve`` alike) and its authentication
  options, without torch, so ``fca dashboard`` refuses a bad flag before anything heavy is imported;
- ``server``: the ``Server`` every session uses (its checkpoints, the one shown first, errors that name no folder);
- ``live``: the live replay view (one checkpoint, one window, one intervention, per token);
- ``inputs``: what a live query runs on (an eval window, or pasted text checked);
- ``session``: one session's update protocol (generations, the document's callbacks) and live replay;
- ``links``: the live view's selection fitted to a checkpoint, a link applied to it, the link of the view shown;
- ``query``: the view's selection as URL query values, checked against what the server can show;
- ``results_folder``: the finished audits of the results folder (listing, tables, downloads, static profiles).

The names below are imported when first used (``fca_workbench.foundation.lazy``).
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = [
    "MAX_PASTE_CHARS",
    "condition_named",
    "Analysis",
    "DashboardSession",
    "SharedModel",
    "TextInput",
    "pasted_input",
    "window_input",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MODEL_IDLE_SECONDS",
    "MODELS",
    "SESSIONS",
    "ModelPool",
    "Registry",
    "SessionLimit",
    "load_registry",
    "release_memory",
    "unload_idle_models",
]

if TYPE_CHECKING:
    from fca_workbench.results.conditions import condition_named
    from fca_workbench.viewmodel.inputs import MAX_PASTE_CHARS, TextInput, pasted_input, window_input
    from fca_workbench.viewmodel.live import Analysis, DashboardSession, SharedModel
    from fca_workbench.viewmodel.pool import (
        MODELS,
        SESSIONS,
        ModelPool,
        Registry,
        SessionLimit,
        load_registry,
        release_memory,
        unload_idle_models,
    )
    from fca_workbench.viewmodel.serving import DEFAULT_MAX_SESSIONS, DEFAULT_MODEL_IDLE_SECONDS
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "fca_workbench.viewmodel.inputs": ["MAX_PASTE_CHARS", "TextInput", "pasted_input", "window_input"],
            "fca_workbench.viewmodel.live": ["Analysis", "DashboardSession", "SharedModel"],
            "fca_workbench.viewmodel.pool": [
                "MODELS",
                "SESSIONS",
                "ModelPool",
                "Registry",
                "SessionLimit",
                "load_registry",
                "release_memory",
                "unload_idle_models",
            ],
            "fca_workbench.viewmodel.serving": ["DEFAULT_MAX_SESSIONS", "DEFAULT_MODEL_IDLE_SECONDS"],
            "fca_workbench.results.conditions": ["condition_named"],
        },
    )
