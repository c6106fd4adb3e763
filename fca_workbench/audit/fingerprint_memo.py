"""The model fingerprint remembered per checkpoint content, in the cache root (``layout.FINGERPRINT_MEMO``).

``capture.model_fingerprint`` hashes every weight: seconds at real sizes, and every audit, sweep, ``fca eval``,
``fca export`` and explorer of one checkpoint would take it again. A session whose model was loaded straight
from a checkpoint folder of safetensors files (``ReplaySession.open``) looks it up instead by the folder's file
identity (``checkpoint_identity``): for each weight file a loader may read (every safetensors file at any depth, and
every shard the index names) its path, size, modification and change times, inode and the digest of its
safetensors header; the digests of the config, the shard index and any code file; how it was loaded (dtype,
controllers) and the libraries that loaded it. The identity is taken before the load and
again after it, and a folder that changed in between is not remembered. Any change is a miss, hashed again.

The memo is read only when it is a plain file inside the cache root (a link, or a path resolving elsewhere, is
ignored with one line), capped and schema-checked, each entry filed under the digest of its own identity; one that
fails any check is ignored (and rewritten by the next hash), never trusted. It is written atomically under a
lock of its own, since audits sharing a cache root take their fingerprints before they take the cache's lock.
An in-memory model (a mini-audit's, a dashboard's, one handed in from Python) is always hashed.
"""

import contextlib
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG
from typing import TypeVar, cast

from filelock import FileLock

from fca_workbench.audit.capture import library_versions
from fca_workbench.foundation.checkpoint import CONFIG_FILE, SAFETENSORS_INDEX
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import (
    canonical_json,
    file_sha256,
    read_json,
    safetensors_header_bytes,
    schema_problem,
    write_json,
)
from fca_workbench.models.loading import index_shards
from fca_workbench.results.layout import FINGERPRINT_MEMO

Loaded = TypeVar("Loaded")
MEMO_FORMAT = "fca-fingerprint-memo/1"
MEMO_MAX_BYTES = 1 << 20  # a few kB an entry
MEMO_ENTRIES = 32  # checkpoints remembered per cache root, the least recently hashed dropped first
MEMO_LOCK_WAIT = 10.0  # seconds; past it the fingerprint is not remembered this time
MEMO_MIN_BYTES = 64 << 20  # of weights: below it hashing them takes no longer than reading the memo
DIGEST = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
MEMO_SCHEMA = {
    "type": "object",
    "required": ["format", "checkpoints"],
    "properties": {
        "format": {"const": MEMO_FORMAT},
        "checkpoints": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["identity", "fingerprint"],
                "properties": {"identity": {"type": "object"}, "fingerprint": DIGEST},
            },
        },
    },
}


def file_identity(path: Path) -> dict:
    """What tells a weight file's content apart without reading its tensors (as ``make`` and ``rsync`` tell
    changed files): where it is, its size, times and inode, and the digest of its safetensors header."""
    header = safetensors_header_bytes(path)
    if header is None:
        raise UserError(f"{path} is not a safetensors file")
    stat = path.stat()
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
        "header_sha256": hashlib.sha256(header).hexdigest(),
    }


def weight_files(folder: Path) -> list[Path]:
    """Every file a loader may read weights from: each safetensors file at any depth and each shard the index
    names (whatever its name); a shard named outside the folder or missing is a ``UserError``."""
    index = folder / SAFETENSORS_INDEX
    shards = index_shards(index).values() if index.is_file() else ()
    return sorted({*folder.rglob("*.safetensors"), *shards})


def checkpoint_identity(folder: Path, loading: dict) -> dict | None:
    """The file identity of the checkpoint in ``folder`` as loaded with ``loading`` (dtype, controllers); None
    for a folder the memo does not cover (no safetensors files, pickled weights anywhere in it, or weights too
    small to be worth it) or whose weights cannot be read (the load says why)."""
    try:
        weights = weight_files(folder)
        if not weights or any(folder.rglob("*.bin")):
            return None
        if sum(path.stat().st_size for path in weights) < MEMO_MIN_BYTES:
            return None
        files = [file_identity(path) for path in weights]
        digests = {
            path.name: file_sha256(path)
            for path in [folder / CONFIG_FILE, folder / SAFETENSORS_INDEX, *sorted(folder.glob("*.py"))]
            if path.is_file()
        }
    except (OSError, UserError):
        return None
    return {"weights": files, "digests": digests, "loading": loading, "versions": library_versions()}


def identity_key(identity: dict) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()


def read_memo(path: Path) -> dict[str, dict]:
    """The memo's entries whose key is the digest of their identity; nothing from a memo that is missing,
    too large, malformed or of another format; nor from one that is not a plain file of the cache root's own
    (a symbolic or hard link: reading it would read a file from elsewhere), which one line names, unread."""
    try:
        stat = path.lstat()
    except OSError:  # none yet
        return {}
    if not S_ISREG(stat.st_mode) or stat.st_nlink != 1:
        print(f"fca: warning: ignoring the fingerprint memo {path}: a link, not a file of its own", file=sys.stderr)
        return {}
    try:
        memo = read_json(path, max_bytes=MEMO_MAX_BYTES)
    except UserError:
        return {}
    if schema_problem(memo, MEMO_SCHEMA) is not None:
        return {}
    entries = cast(dict, memo)["checkpoints"]
    return {key: entry for key, entry in entries.items() if key == identity_key(entry["identity"])}


def remembered_fingerprint(root: Path, identity: dict | None, compute: Callable[[], str], write: bool = True) -> str:
    """The fingerprint the memo in ``root`` holds for ``identity``, else ``compute()``'s, remembered there
    (``write``: under torchrun only rank 0 writes); ``compute()``'s alone for a checkpoint not covered."""
    if identity is None:
        return compute()
    path, key = root / FINGERPRINT_MEMO, identity_key(identity)
    found = read_memo(path).get(key)
    if found is not None:
        return cast(str, found["fingerprint"])
    fingerprint = compute()
    if write:
        remember(path, key, {"identity": identity, "fingerprint": fingerprint})
    return fingerprint


def remember(path: Path, key: str, entry: dict) -> None:
    """``entry`` put into the memo at ``path`` under ``key``, the most recent last; a cache root that cannot be
    written, or whose memo another process holds for long, is left as it is (hashed again next time)."""
    with contextlib.suppress(OSError):  # filelock's Timeout among them
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.with_name(f".{FINGERPRINT_MEMO}.lock"), timeout=MEMO_LOCK_WAIT):
            entries = read_memo(path)
            entries.pop(key, None)
            entries[key] = entry
            write_json(path, {"format": MEMO_FORMAT, "checkpoints": dict(list(entries.items())[-MEMO_ENTRIES:])})


def loaded_identity(folder: Path, loading: dict, load: Callable[[], Loaded]) -> tuple[Loaded, dict | None]:
    """``load()``'s result, and the identity of ``folder`` when it was the same before and after the load
    (None: not covered, or changed while it was read)."""
    before = checkpoint_identity(folder, loading)
    loaded = load()
    return loaded, before if before is not None and before == checkpoint_identity(folder, loading) else None
