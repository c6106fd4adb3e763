"""The finished audits of one results folder, as the dashboard shows them.

``fca dashboard --results DIR`` lists every ``audit.json`` under DIR (``fca audit``'s ``results/audit-NAME``,
``audit-many``'s ``OUT/NAME``, ``fca reproduce``'s ``OUT/audits/NAME``); the browser picks an entry by its name
(the folder relative to DIR), never by a path. Only regular files inside DIR are read: a link, or a file that
resolves outside DIR, is refused with a message. An entry that cannot be shown (truncated, foreign, invalid)
keeps its one-line message and the others still work.

Every table is one of ``tables.py``'s, so a download equals the table ``fca reproduce`` writes; the audit's
static profiles serve the live view when their fingerprints match the checkpoint and calibration data.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fca_workbench import tables
from fca_workbench.errors import UserError
from fca_workbench.results.frames import read_audit_json
from fca_workbench.results.layout import AUDIT_FILE, CACHE_DIR, FIGURES_DIR, NOTEBOOKS_DIR, PROFILES_FILE, TABLES_DIR
from fca_workbench.results.profiles import verified_profiles

MAX_DEPTH = 4  # results/<run>/audits/<name>/audit.json is 3 deep; deeper folders are not searched
PRUNED = {CACHE_DIR, TABLES_DIR, FIGURES_DIR, NOTEBOOKS_DIR, "__pycache__"}  # hold no audit.json, may hold many files
PARSED_KEPT = 256  # parsed audit.json files kept per process, keyed by (path, mtime, size)


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
        tables.retention_table([audit]),
        tables.variation_table([audit]),
        tables.execution_table([audit]),
        tables.positive_control_table([audit]),
        tables.per_layer_table([audit]),
    )
    return [table for table in made if len(table)]


class ResultsFolder:
    """The audits under ``root``, rescanned on ``scan``; parsed files are kept while unchanged."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._parsed: OrderedDict = OrderedDict()
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
        name = self._name(folder)
        key: tuple = ()
        try:
            path = self.inside(folder / AUDIT_FILE)
            stat = path.stat()
            key = (str(path), stat.st_mtime_ns, stat.st_size)
            with self._mutex:
                cached = self._parsed.get(key)
            if cached is None:
                try:
                    cached = (read_audit_json(path)[0], None)
                except UserError as exc:  # the message names the server's path: name the entry instead
                    cached = (None, str(exc).replace(str(path), f"{name}/{AUDIT_FILE}"))
                with self._mutex:
                    self._parsed[key] = cached
                    while len(self._parsed) > PARSED_KEPT:
                        self._parsed.popitem(last=False)
            audit, problem = cached
        except UserError as exc:
            audit, problem, key = None, str(exc), ()
        return AuditEntry(name, folder, audit, problem, key)

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
        return sorted(matching, key=lambda e: (e.folder / AUDIT_FILE).stat().st_mtime_ns, reverse=True)


def matching_profiles(
    results: ResultsFolder, shared: AuditedModel, calibration_fingerprint: str
) -> tuple[AuditEntry, dict] | None:
    """(entry, profiles) of the newest audit of this model whose calibration windows have this fingerprint
    and that saved its static profiles; None when there is none. A UserError saying why when that audit's
    file is not the one it wrote (``profiles.verified_profiles``: its recorded sha256, parsing, finite)."""
    for entry in results.audits_of(shared):
        if entry.valid_audit["data"]["calibration"].get("fingerprint") != calibration_fingerprint:
            continue
        try:
            data = results.read_bytes(entry, PROFILES_FILE)
        except (UserError, OSError):
            continue
        recorded = (entry.valid_audit.get("static_profiles") or {}).get("sha256")
        return entry, verified_profiles(data, recorded, f"audit '{entry.name}''s {PROFILES_FILE}")
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
