"""What a dashboard server process holds for all its sessions: the registry of checkpoint names the browser may
pick (never a path), the pool of loaded checkpoints (each loaded once, unloaded when idle, never while in use)
and the cap on open sessions. Memory stays bounded for a server left running."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fca_workbench.foundation.checkpoint import checkpoint_name, hub_name, is_checkpoint, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json
from fca_workbench.foundation.resources import checkpoints_dir
from fca_workbench.viewmodel.live import DashboardSession, SharedModel
from fca_workbench.viewmodel.results_folder import ResultsFolder
from fca_workbench.viewmodel.serving import DEFAULT_MAX_SESSIONS, DEFAULT_MODEL_IDLE_SECONDS


@dataclass(frozen=True)
class Registry:
    """Names the browser may pick, each mapped to a checkpoint folder on the server."""

    entries: dict[str, Path]

    @classmethod
    def shipped(cls, root: Path | None = None) -> Registry:
        """The shipped checkpoints that exist now (a folder with a config.json and weights)."""
        root = Path(root) if root else checkpoints_dir()
        folders = sorted(p for p in root.glob("*") if is_checkpoint(p) and any(p.glob("*.safetensors")))
        return cls({p.name: p for p in folders})

    @classmethod
    def from_file(cls, path: str | Path) -> Registry:
        """A JSON file ``{"name": "folder", ...}``, or a list ``["folder", ...]`` named by ``checkpoint_name``;
        relative folders are relative to the file's own folder; a hub name ``ORG/NAME[@REVISION]`` that is no
        folder there is resolved now (``checkpoint.resolve_checkpoint``), so a name missing from the cache is one
        line at start."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"registry file not found: {path}")
        raw = read_json(path, expect=None)
        if isinstance(raw, dict) and isinstance(raw.get("checkpoints"), (dict, list)):
            raw = raw["checkpoints"]
        if isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            named = {checkpoint_name(v) if hub_name(v) else Path(v).name: v for v in raw}
            if len(named) < len(raw):
                raise UserError(f"registry {path} lists two checkpoints of the same name; name them in an object")
            raw = named
        if (
            not isinstance(raw, dict)
            or not raw
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items())
        ):
            raise UserError(
                f'registry {path} must be a non-empty JSON object {{"name": "folder", ...}} or list ["folder", ...]'
            )
        return cls({name: _registered(path.parent, folder) for name, folder in raw.items()})

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def folder(self, name: str) -> Path:
        if name not in self.entries:
            raise UserError(f"unknown checkpoint '{name}'")
        return self.entries[name]


def _registered(base: Path, folder: str) -> Path:
    """A registry entry's folder: ``folder`` relative to ``base``, else the hub name's cached snapshot."""
    local = base / folder
    if local.exists() or not hub_name(folder):
        return local.resolve()
    return resolve_checkpoint(folder).folder


def load_registry(path: str | Path | None = None) -> Registry:
    registry = Registry.from_file(path) if path else Registry.shipped()
    if not registry.entries:
        raise UserError(f"no checkpoints to serve: none finished in {checkpoints_dir()}; pass --registry FILE")
    return registry


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so freed memory shows as freed."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class ModelPool:
    """The process's ``SharedModel``s: each checkpoint loaded once and shared by every session, and unloaded
    once no session has used it for ``idle_seconds`` (0: never).

    A model is in use from ``acquire`` to ``release`` (one update of one session) and is never unloaded then.
    Sessions keep prefix caches that hold the model; ``attach`` them and ``unload_idle`` makes them drop those,
    so the memory of an unloaded model is really freed even while a forgotten tab stays open.
    """

    def __init__(
        self, idle_seconds: float = DEFAULT_MODEL_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.idle_seconds, self.clock = idle_seconds, clock
        self._models: dict[tuple, SharedModel] = {}
        self._users: dict[tuple, int] = {}
        self._last_used: dict[tuple, float] = {}
        self._loading: dict[tuple, threading.Lock] = {}
        self._sessions: weakref.WeakSet[DashboardSession] = weakref.WeakSet()
        self._mutex = threading.Lock()

    def acquire(
        self,
        folder: str | Path,
        calibration_windows: int | None = None,
        eval_windows: int | None = None,
        results: ResultsFolder | None = None,
    ) -> SharedModel:
        """The shared model of ``folder``, loaded on first use (a failed load is not kept); in use until
        ``release``. ``results``: the ``ResultsFolder`` whose audits may serve its static profiles."""
        key = (str(Path(folder).resolve()), calibration_windows, eval_windows, results and results.root)
        with self._mutex:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # one load per checkpoint at a time; other checkpoints load alongside
            with self._mutex:
                shared = self._models.get(key)
            if shared is None:
                shared = SharedModel(folder, calibration_windows, eval_windows, results)
            with self._mutex:
                self._models[key] = shared
                self._users[key] = self._users.get(key, 0) + 1
                self._last_used[key] = self.clock()
        return shared

    def release(self, shared: SharedModel) -> None:
        with self._mutex:
            for key, model in self._models.items():
                if model is shared:
                    self._users[key] -= 1
                    self._last_used[key] = self.clock()

    def attach(self, session: DashboardSession) -> None:
        self._sessions.add(session)

    def unload_idle(self) -> list[Path]:
        """Unload every model unused for ``idle_seconds``; returns their folders."""
        if not self.idle_seconds:
            return []
        now = self.clock()
        with self._mutex:
            idle = [
                key for key in self._models if self._users[key] == 0 and now - self._last_used[key] >= self.idle_seconds
            ]
            unloaded = [self._models.pop(key) for key in idle]
            for key in idle:
                del self._users[key], self._last_used[key]
        for shared in unloaded:
            for session in list(self._sessions):
                session.forget(shared)
        if unloaded:
            release_memory()
        return [shared.folder for shared in unloaded]

    @property
    def loaded(self) -> list[Path]:
        with self._mutex:
            return [shared.folder for shared in self._models.values()]


class SessionLimit:
    """At most ``maximum`` sessions open at once in the process (0: no limit)."""

    def __init__(self, maximum: int = DEFAULT_MAX_SESSIONS) -> None:
        self.maximum, self.open = maximum, 0
        self._mutex = threading.Lock()

    def admit(self) -> bool:
        """Count one more session if it fits; False (nothing counted) when the server is full."""
        with self._mutex:
            if self.maximum and self.open >= self.maximum:
                return False
            self.open += 1
            return True

    def leave(self) -> None:
        with self._mutex:
            self.open -= 1


MODELS = ModelPool()  # process-wide: ``panel serve`` runs the app's script once per session, this module once
SESSIONS = SessionLimit()


def unload_idle_models() -> None:
    """``MODELS.unload_idle`` as one callable for the whole process: Panel's ``schedule_task`` keeps the first
    task of a name and warns at every session that brings another callable (a bound method is new each time)."""
    MODELS.unload_idle()
