"""The dashboard's view model: every number the Panel app (``dashboards/app.py``) shows comes from here; the
app only presents.

- ``pool``: what the server process holds for every session (checkpoint registry, model pool, session cap);
- ``live``: the live replay view (one checkpoint, one window, one intervention, per token);
- ``results_folder``: the finished audits of the results folder (listing, tables, downloads, static profiles);
- ``query``: the view's selection as URL query values, checked against what the server can show;
- ``panel_writes``: a fix for Panel's queue of websocket writes, which could leave a session's last change unsent.
"""

from fca_workbench.dashboard.live import (
    DERANGEMENTS_KEPT,
    MAX_PASTE_CHARS,
    Analysis,
    DashboardSession,
    SharedModel,
    TextInput,
    pasted_input,
    window_input,
)
from fca_workbench.dashboard.pool import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MODEL_IDLE_SECONDS,
    MODELS,
    SESSIONS,
    ModelPool,
    Registry,
    SessionLimit,
    load_registry,
    release_memory,
    unload_idle_models,
)
from fca_workbench.results.conditions import CONDITION_HELP, SEEDED

__all__ = [
    "CONDITION_HELP",
    "DERANGEMENTS_KEPT",
    "MAX_PASTE_CHARS",
    "SEEDED",
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
