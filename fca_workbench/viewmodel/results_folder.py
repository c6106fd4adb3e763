"""The finished audits of one results folder, as the dashboard shows them.

``fca dashboard --results DIR`` lists every ``audit.json`` under DIR (``fca audit``'s ``results/audit-NAME``,
``audit-many``'s ``OUT/NAME``, ``fca reproduce``'s ``OUT/audits/NAME``); the browser picks an entry by its name
(the folder relative to DIR), never by a path. Only regular files inside DIR are read: a link, or a file that
resolves outside DIR, is refused with a message. An entry that cannot be shown for any reason (too large, truncated,
nested too deeply, foreign, invalid, past the scan's time or byte bound) keeps its one-line message and the others
still work. A scan holds only each audit's summary fields (``SUMMARY_FIELDS``: what the overview and the listing
show), bounded per audit and in all; one audit is read whole when it is shown (``ResultsFolder.full``).

Every table is one of ``tables.py``'s, so a download equals the table ``fca reproduce`` writes; the audit's
static profiles serve the live view when their fingerprints match the checkpoint and calibration data.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cachetools

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import canonical_json
from fca_workbench.notebooks import tables
from fca_workbench.results.binding import binding
from fca_workbench.results.conditions import retention_profiles
from fca_workbench.results.layout import AUDIT_FILE, CACHE_DIR, FIGURES_DIR, NOTEBOOKS_DIR, PROFILES_FILE, TABLES_DIR
from fca_workbench.results.profiles import verified_profiles
from fca_workbench.results.schema import read_audit_json

MAX_DEPTH = 4  # results/<run>/audits/<name>/audit.json is 3 deep; deeper folders are not searched
PRUNED = {CACHE_DIR, TABLES_DIR, FIGURES_DIR, NOTEBOOKS_DIR, "__pycache__"}  # hold no audit.json, may hold many files
AUDIT_MAX_BYTES = 16 << 20  # an audit.json larger than this is listed as a problem, never parsed
PARSED_BYTES = 32 << 20  # the audit.json bytes whose whole parsed audits are kept per folder (those shown lately)


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
        tables.per_controller_table([audit]),
    )
    return [table for table in made if len(table)]


SUMMARY_MAX_BYTES = 256 << 10  # one audit's summary fields (as JSON) larger than this: a problem, never held
OVERVIEW_BYTES = 32 << 20  # the summaries one scan holds, all together; audits past it are listed as problems
SCAN_SECONDS = 30.0  # a scan parses no new audit.json after this; the rest are listed, read by the next scan

# What a scan keeps of each audit: the fields the overview, the listing, the detail's header and the search for a
# checkpoint's audits read (a tuple: those keys of a dict; a dict: its keys, each pruned again; EACH: every key of
# a dict, pruned alike; None: the value as it is). Everything else (the per-layer sweep, any padding) is read
# again, for one audit, when it is shown in detail or compared (``ResultsFolder.full``).
EACH = "*"
SUMMARY_FIELDS: dict = {
    "schema": None,
    "model": ("path", "arch", "params", "fingerprint", "configuration", "hub"),
    "data": {split: ("source", "windows", "window", "tokens", "fingerprint") for split in ("eval", "calibration")},
    "conditions": {EACH: ("nll", "ci95", "delta", "delta_ci95")},
    "retention": {EACH: ("value", "ci95", "resolved", "reference", "numerator", "denominator", "other_references")},
    "variance": None,
    "variation": ("within_std", "cv"),
    "execution": None,
    "settings": None,
    "verdict": None,
    "static_profiles": ("sha256",),
}


def summary_of(audit: dict) -> dict:
    """The fields of a validated audit that a scan keeps (``SUMMARY_FIELDS``), in the audit's own shape, so the
    overview's and the listing's functions read a summary as they read the audit."""
    return _pruned(audit, SUMMARY_FIELDS)


def _pruned(value: Any, fields: Any) -> Any:
    if fields is None or not isinstance(value, dict):
        return value
    if isinstance(fields, tuple):
        return {key: value[key] for key in fields if key in value}
    if EACH in fields:
        return {key: _pruned(item, fields[EACH]) for key, item in value.items()}
    return {key: _pruned(value[key], sub) for key, sub in fields.items() if key in value}


def byte_bounded_cache(max_bytes: int) -> cachetools.LRUCache:
    """A least-recently-used cache of ``(value, size)`` pairs whose sizes add up to at most ``max_bytes``
    (cachetools; callers hold a lock around it, and keep no pair larger than the whole cache)."""
    return cachetools.LRUCache(maxsize=max_bytes, getsizeof=lambda kept: kept[1])


def kept(cache: cachetools.LRUCache, lock: threading.Lock, key: Hashable) -> Any:
    """The value ``cache`` holds for ``key`` (None: none), under ``lock``."""
    with lock:
        pair = cache.get(key)
    return None if pair is None else pair[0]


def keep(cache: cachetools.LRUCache, lock: threading.Lock, key: Hashable, value: Any, size: int) -> None:
    """Keep ``value`` (of ``size`` bytes) unless it alone is larger than the cache."""
    if size <= cache.maxsize:
        with lock:
            cache[key] = (value, size)


class ResultsFolder:
    """The audits under ``root``, rescanned on ``scan``. A scan holds each audit's summary fields only
    (``summary_of``), at most ``overview_bytes`` of them in all, and parses no new file after ``scan_seconds``;
    ``full`` reads one audit whole when it is shown. Summaries and whole audits are kept while unchanged."""

    def __init__(
        self,
        root: str | Path,
        max_bytes: int = AUDIT_MAX_BYTES,
        overview_bytes: int = OVERVIEW_BYTES,
        scan_seconds: float = SCAN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = Path(root).resolve()
        self.max_bytes, self.overview_bytes, self.scan_seconds, self.clock = (
            max_bytes,
            overview_bytes,
            scan_seconds,
            clock,
        )
        self._summaries = byte_bounded_cache(overview_bytes)  # (summary, problem) by (path, mtime, size)
        self._parsed = byte_bounded_cache(PARSED_BYTES)  # whole audits shown lately, by the same key
        self._cache_lock = threading.Lock()
        self._entries: dict[str, AuditEntry] = {}
        self._mutex = threading.Lock()

    def scan(self) -> list[AuditEntry]:
        """Every ``audit.json`` under the folder (links not followed), sorted by name: each with its summary, or
        its problem (one that could not be read within this scan's bounds says which bound)."""
        found = []
        deadline, held = self.clock() + self.scan_seconds, 0
        if self.root.is_dir():
            for folder, subfolders, files in os.walk(self.root, followlinks=False):
                depth = len(Path(folder).relative_to(self.root).parts)
                subfolders[:] = sorted(
                    d for d in subfolders if d not in PRUNED and not d.startswith(".") and depth < MAX_DEPTH
                )
                if AUDIT_FILE in files:
                    entry, size = self._entry(Path(folder), deadline, self.overview_bytes - held)
                    held += size
                    found.append(entry)
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

    def full(self, entry: AuditEntry) -> dict:
        """The whole validated audit of a listed entry, read again (kept while unchanged); a ``UserError`` when
        it cannot be read or changed since the scan listed it."""
        if entry.audit is None:
            raise UserError(f"{entry.name}: {entry.problem}")
        audit = kept(self._parsed, self._cache_lock, entry.version)
        if audit is not None:
            return audit
        try:
            path = self.inside(entry.folder / AUDIT_FILE)
            stat = path.stat()
        except (UserError, OSError) as exc:
            raise UserError(f"{entry.name}/{AUDIT_FILE} cannot be read now: {first_line(exc)}") from None
        if (str(path), stat.st_mtime_ns, stat.st_size) != entry.version:
            raise UserError(f"{entry.name}/{AUDIT_FILE} changed since it was listed: look for new audits")
        audit, problem = self._parse(path, entry.name, stat.st_size)
        if audit is None:
            raise UserError(problem)
        keep(self._parsed, self._cache_lock, entry.version, audit, stat.st_size)
        return audit

    def _name(self, folder: Path) -> str:
        return folder.relative_to(self.root).as_posix()

    def _entry(self, folder: Path, deadline: float, room: int) -> tuple[AuditEntry, int]:
        """The entry of one folder's audit.json and the bytes of summary it holds: its summary, or whatever went
        wrong (the scan's time or byte bound among it) as its one-line problem."""
        name = self._name(folder)
        key: tuple = ()
        try:
            path = self.inside(folder / AUDIT_FILE)
            stat = path.stat()
            key = (str(path), stat.st_mtime_ns, stat.st_size)
            cached = kept(self._summaries, self._cache_lock, key)
            if cached is None:
                if self.clock() > deadline:
                    reason = (
                        f"not read: this scan reached its {self.scan_seconds:g} s bound; 'Look for new audits' reads it"
                    )
                    return AuditEntry(name, folder, None, reason), 0
                cached = self._summarised(path, name, stat.st_size)
                keep(self._summaries, self._cache_lock, key, cached, cached[2])
            summary, problem, size = cached
        except (UserError, OSError) as exc:
            return AuditEntry(name, folder, None, first_line(exc)), 0
        if summary is not None and size > room:
            reason = f"not listed: the overview holds at most {self.overview_bytes >> 20} MiB of audit summaries"
            return AuditEntry(name, folder, None, reason), 0
        if summary is None:
            return AuditEntry(name, folder, None, problem), 0
        return AuditEntry(name, folder, summary, None, key), size

    def _summarised(self, path: Path, name: str, size: int) -> tuple[dict | None, str | None, int]:
        """(summary, None, its size as JSON), or (None, the problem, its length)."""
        audit, problem = self._parse(path, name, size)
        if audit is None:
            return None, problem, len(problem or "")
        summary = summary_of(audit)
        held = len(canonical_json(summary))
        if held > SUMMARY_MAX_BYTES:
            problem = f"{name}/{AUDIT_FILE}: its summary fields take more than {SUMMARY_MAX_BYTES >> 10} KiB"
            return None, problem, len(problem)
        return summary, None, held

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
    """The newest audit of this checkpoint with a per-layer sweep, if any (each read whole: a scan keeps no sweep)."""
    for entry in results.audits_of(shared):
        try:
            if results.full(entry).get("per_layer"):
                return entry
        except UserError:
            continue
    return None
