"""The ``Server`` every session of a dashboard process uses: which checkpoints it offers, which one a session
shows first, and each checkpoint's shared model with errors that name the checkpoint, never the server's folder;
``configure`` applies the served settings (``serving.ServedSettings``) to the process and returns it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from fca_workbench.foundation.errors import UserError
from fca_workbench.viewmodel.live import SharedModel
from fca_workbench.viewmodel.pool import MODELS, SESSIONS, Registry, load_registry
from fca_workbench.viewmodel.results_folder import ResultsFolder
from fca_workbench.viewmodel.serving import ServedSettings


@dataclass
class Server:
    """What every session of the process is served: the registry's checkpoints, each one's shared model (from
    ``MODELS``, with these calibration windows and this results folder) and the one a session shows first."""

    registry: Registry
    calibration_windows: int | None = None
    results: ResultsFolder | None = None
    _default: str | None = field(default=None, init=False, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def acquire(self, name: str) -> SharedModel:
        """The process-wide model of checkpoint ``name`` (loaded once, shared read-only by all sessions), in use
        until ``release``. A load error names the checkpoint, never the server's folder."""
        folder = self.registry.folder(name)
        try:
            return MODELS.acquire(folder, calibration_windows=self.calibration_windows, results=self.results)
        except UserError as exc:
            shown = str(exc).replace(str(folder), f"'{name}'")
            raise UserError(f"checkpoint '{name}' cannot be used: {shown}") from None

    def release(self, model: SharedModel) -> None:
        MODELS.release(model)

    def default_checkpoint(self) -> str:
        """The first checkpoint of the registry whose model has a controller (the live view shows coefficients),
        else the first; found once (loading models in registry order until one has one), then kept."""
        with self._mutex:
            if self._default is None:
                self._default = next((name for name in self.registry.names if self._has_controller(name)), None)
                self._default = self._default or self.registry.names[0]
            return self._default

    def _has_controller(self, name: str) -> bool:
        try:
            model = self.acquire(name)
        except UserError:  # a checkpoint that cannot be loaded is not the default; picking it shows why
            return False
        try:
            return model.has_coefficients
        finally:
            self.release(model)


_SERVERS: dict[tuple, Server] = {}  # per process: ``panel serve`` configures once per session, with the same settings
_SERVERS_MUTEX = threading.Lock()


def configure(settings: ServedSettings) -> Server:
    """Apply ``settings`` to the process (session cap, model idle time, torch threads) and return its ``Server``;
    the same settings give the same ``Server`` again (its default checkpoint is found once)."""
    registry = load_registry(settings.registry)
    SESSIONS.maximum = settings.max_sessions
    MODELS.idle_seconds = settings.model_idle_seconds
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    results = ResultsFolder(settings.results) if settings.results else None
    key = (tuple(registry.entries.items()), settings.calibration_windows, results and results.root)
    with _SERVERS_MUTEX:
        if key not in _SERVERS:
            _SERVERS[key] = Server(registry, settings.calibration_windows, results)
        return _SERVERS[key]
