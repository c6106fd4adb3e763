"""The finished audits of one results folder, as the dashboard shows them.

``fca dashboard --results DIR`` lists every ``audit.json`` under DIR (``fca audit``'s ``results/audit-NAME``,
``audit-many``'s ``OUT/NAME``, ``fca reproduce``'s ``OUT/audits/NAME``); the browser picks an entry by its name
(the folder relative to DIR), never by a path. Only regular files inside DIR are read: a link, or a file that
resolves outside DIR, is refused with a message. An entry that cannot be shown for any reason (too large, truncated,
nested too deeply, foreign, invalid) keeps its one-line message and the others still work; parsed files are
kept in a cache bounded by bytes.

Every table is one of ``tables.py``'s, so a download equals the table ``fca reproduce`` writes; the audit's
static profiles serve the live view when their fingerprints match the checkpoint and calibration data.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.notebooks import tables
from fca_workbench.results.binding import binding
from fca_workbench.results.conditions import retention_profiles
from fca_workbench.results.layout import AUDIT_FILE, CACHE_DIR, FIGURES_DIR, NOTEBOOKS_DIR, PROFILES_FILE, TABLES_DIR
from fca_workbench.results.profiles import verified_profiles
from fca_workbench.results.schema import read_audit_json

MAX_DEPTH = 4  # results/<run>/audits/<name>/audit.json is 3 deep; deeper folders are not searched
PRUNED = {CACHE_DIR, TABLES_DIR, FIGURES_DIR, NOTEBOOKS_DIR, "__pycache__"}  # hold no audit.json, may hold many files
AUDIT_MAX_BYTES = 16 << 20  # an audit.json larger than this is listed as a problem, never parsed
PARSED_BYTES = 64 << 20  # the audit.json bytes whose parsed audits are kept per process, keyed by (path, mtime, size)


class AuditedModel(Protocol):
    """What finding a model's audits needs of it (a ``live.SharedModel``): cheap checks, then the fingerprint."""

    @property
    def arch(self) -> str: ...

    @property
    def params(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class AuditEntry:
    """One ``audit.json`` found: ``name`` is its folder relative to the results folder (what the browser
    picks); ``audit`` the validated dict, or None with ``problem`` saying why in one line."""

    name: str
    folder: Path
    audit: dict | None
    problem: str | None = None
    version: tuple = ()  # (path, mtime, size) of its audit.json: what was read, to cache what is made of it

    @property
    def valid_audit(self) -> dict:
        """The audit of a valid entry; a ``UserError`` with its problem for one that cannot be shown."""
        if self.audit is None:
            raise UserError(f"{self.name}: {self.problem}")
        return self.audit

    @property
    def label(self) -> str:
        """How a valid entry is listed: its name, model and architecture."""
        return f"{self.name} ({self.model_name}, {self.valid_audit['model']['arch']})"

    @property
    def model_name(self) -> str:
        return tables.model_name(self.valid_audit)


def audit_tables(audit: dict) -> list:
    """The audit's tables (``tables.py``, one audit): those with rows, in reading order."""
    made = (
        tables.assignment_table([audit]),
        tables.retention_table([audit], retention_profiles(audit["retention"])),
        tables.variation_table([audit]),
        tables.execution_table([audit]),
        tables.positive_control_table([audit]),
        tables.per_layer_table([audit]),
    )
    return [table for table in made if len(table)]


class SizedCache:
    """Values kept by key, least recently used first out, while their sizes add up to at most ``max_bytes`` (a
    value larger than that is not kept); safe to share between threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self._values: OrderedDict = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept for ``key``, else None."""
        with self._mutex:
            if key not in self._values:
                return None
            self._values.move_to_end(key)
            return self._values[key][0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        with self._mutex:
            if key in self._values:
                self.bytes -= self._values.pop(key)[1]
            if size > self.max_bytes:
                return
            self._values[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                self.bytes -= self._values.popitem(last=False)[1][1]


class ResultsFolder:
    """The audits under ``root``, rescanned on ``scan``; parsed files are kept while unchanged."""

    def __init__(self, root: str | Path, max_bytes: int = AUDIT_MAX_BYTES) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self._parsed = SizedCache(PARSED_BYTES)
        self._entries: dict[str, AuditEntry] = {}
        self._mutex = threading.Lock()

    def scan(self) -> list[AuditEntry]:
        """Every ``audit.json`` under the folder (links not followed), sorted by name."""
        found = []
        if self.root.is_dir():
            for folder, subfolders, files in os.walk(self.root, followlinks=False):
                depth = len(Path(folder).relative_to(self.root).parts)
                subfolders[:] = sorted(
                    d for d in subfolders if d not in PRUNED and not d.startswith(".") and depth < MAX_DEPTH
                )
                if AUDIT_FILE in files:
                    found.append(self._entry(Path(folder)))
        with self._mutex:
            self._entries = {entry.name: entry for entry in found}
        return found

    def entry(self, name: object) -> AuditEntry:
        """The entry of the last scan called ``name``; anything else is a ``UserError``."""
        with self._mutex:
            entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise UserError(f"no audit called {name!r} in the results folder")
        return entry

    def _name(self, folder: Path) -> str:
        return folder.relative_to(self.root).as_posix()

    def _entry(self, folder: Path) -> AuditEntry:
        """The entry of one folder's audit.json: its audit, or whatever went wrong as its one-line problem."""
        name = self._name(folder)
        key: tuple = ()
        try:
            path = self.inside(folder / AUDIT_FILE)
            stat = path.stat()
            key = (str(path), stat.st_mtime_ns, stat.st_size)
            cached = self._parsed.get(key)
            if cached is None:
                cached = self._parse(path, name, stat.st_size)
                self._parsed.put(key, cached, stat.st_size)
            audit, problem = cached
        except (UserError, OSError) as exc:
            audit, problem, key = None, first_line(exc), ()
        return AuditEntry(name, folder, audit, problem, key)

    def _parse(self, path: Path, name: str, size: int) -> tuple[dict | None, str | None]:
        """(audit, None), or (None, the problem) naming the entry, never the server's path."""
        shown = f"{name}/{AUDIT_FILE}"
        if size > self.max_bytes:
            return None, f"{shown} is larger than {self.max_bytes >> 20} MiB: not read"
        try:
            return read_audit_json(path)[0], None
        except UserError as exc:
            return None, first_line(str(exc).replace(str(path), shown))
        except Exception as exc:  # any failure of one file (nested too deeply, ...) is that entry's problem
            return None, f"{shown} cannot be read: {first_line(exc)}"

    def inside(self, path: Path) -> Path:
        """``path`` if it is a regular file inside the results folder and no link; else a ``UserError``."""
        shown = self._name(path)
        if path.is_symlink():
            raise UserError(f"{shown} is a link: only files inside the results folder are read")
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise UserError(f"{shown} lies outside the results folder: refused")
        if not resolved.is_file():
            raise UserError(f"{shown} is not a file")
        return resolved

    def read_bytes(self, entry: AuditEntry, filename: str) -> bytes:
        """A file of an entry's folder, read without following a link (checked again at reading time)."""
        path = self.inside(entry.folder / filename)
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(descriptor, "rb") as handle:
            return handle.read()

    def download(self, entry: AuditEntry, filename: str) -> bytes:
        """``read_bytes`` for the browser: a file that cannot be read now is a ``UserError`` naming the entry's
        file, never the server's path (an ``OSError``'s own text would)."""
        try:
            return self.read_bytes(entry, filename)
        except (UserError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else exc
            raise UserError(f"{entry.name}/{filename} cannot be read now: {reason}") from None

    def audits_of(self, shared: AuditedModel) -> list[AuditEntry]:
        """Valid audits of a loaded checkpoint (a ``SharedModel``) by its fingerprint, newest first. Cheap checks
        (arch, parameter count) come before any hashing."""
        matching = []
        for entry in self.scan():
            audit = entry.audit
            if audit is None or audit["model"]["arch"] != shared.arch or audit["model"]["params"] != shared.params:
                continue
            if shared.fingerprint == audit["model"]["fingerprint"]:
                matching.append(entry)
        return sorted(matching, key=lambda e: e.version[1], reverse=True)  # version: (path, mtime, size)


def matching_profiles(
    results: ResultsFolder, shared: AuditedModel, calibration_fingerprint: str
) -> tuple[AuditEntry, dict] | None:
    """(entry, profiles) of the newest audit of this model whose calibration windows have this fingerprint
    and that saved its static profiles; None when there is none. A UserError saying why when that audit's
    file is not the one it wrote (``profiles.verified_profiles``: its recorded sha256, parsing, bound to this
    model and these calibration windows, finite)."""
    for entry in results.audits_of(shared):
        if entry.valid_audit["data"]["calibration"].get("fingerprint") != calibration_fingerprint:
            continue
        try:
            data = results.read_bytes(entry, PROFILES_FILE)
        except (UserError, OSError):
            continue
        recorded = (entry.valid_audit.get("static_profiles") or {}).get("sha256")
        expected = binding(shared.fingerprint, {"calibration": calibration_fingerprint})
        against = "the loaded checkpoint and its calibration windows"
        return entry, verified_profiles(data, recorded, f"audit '{entry.name}''s {PROFILES_FILE}", expected, against)
    return None


def saved_profiles(
    results: ResultsFolder, shared: AuditedModel, calibration_fingerprint: str, needed: set[str]
) -> tuple[dict | None, str | None]:
    """``(profiles, where from)`` of the newest audit of this model with these calibration windows that saved
    every profile ``needed``, when its file passes ``verified_profiles``; ``(None, why not)`` when it fails,
    ``(None, None)`` when no audit has them: the live view then computes them, with the reason as its note."""
    try:
        found = matching_profiles(results, shared, calibration_fingerprint)
    except UserError as exc:
        return None, f"{exc}: not used"
    if found is None or not needed <= set(found[1]):
        return None, None
    entry, profiles = found
    matched = "model and calibration fingerprints match, sha256 as its audit.json records"
    return profiles, f"audit '{entry.name}' (its {PROFILES_FILE}: {matched})"


def per_layer_audit(results: ResultsFolder, shared: AuditedModel) -> AuditEntry | None:
    """The newest audit of this checkpoint with a per-layer sweep, if any."""
    return next((entry for entry in results.audits_of(shared) if entry.valid_audit.get("per_layer")), None)
