"""Files the workbench writes and reads: atomic writes, content hashes, and JSON Schema validation.

Every file is written through ``write_atomic`` (bytes) or ``atomic_path`` (a writer that needs a path): a
temporary sibling, then a rename, so a crash never leaves a half-written result; tensors and files are
identified by sha256 of exactly their bytes. Every JSON file is read through ``read_json`` (bounded in
size, any malformation one line naming the file) and written through ``write_json`` (strict JSON: a NaN or
an infinity is refused, never written as a bare ``NaN`` token that other JSON readers reject).
"""

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import torch

from fca_workbench.errors import UserError, first_line


def temporary_sibling(path: Path) -> Path:
    """The hidden name ``path`` is written under before it is renamed into place (``.<name>.tmp``)."""
    return path.with_name(f".{path.name}.tmp")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` for writers that need a path of their own (``torch.save``, safetensors,
    a folder copied into place): renamed over ``path`` when the block ends, removed when it raises, so
    ``path`` is either its old self or complete. A leftover of an interrupted earlier write is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    tmp.replace(path)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """A fresh private folder (``mkdtemp``: an unpredictable name, mode 0700) beside ``path`` to fill, renamed
    to ``path`` (which must not exist, or be an empty folder) when the block ends and removed when it raises:
    unlike a fixed sibling name, nobody can plant a link at it beforehand to redirect what is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        tmp.replace(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_atomic(path: Path, payload: bytes) -> None:
    """Write to a temporary sibling, then rename, so a crash never leaves a half-written file."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(payload)


JSON_MAX_BYTES = 64 << 20  # far above any config, index, manifest or audit.json the workbench meets


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(text: str | bytes, source: str) -> object:
    """``text`` parsed as strict JSON (no ``NaN``/``Infinity``); any malformation, nesting too deep for the
    parser included, is one ``UserError`` line naming ``source``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise UserError(f"{source} is nested too deeply to be read as JSON") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{source} is not valid JSON: {first_line(exc)}") from None


def read_json(path: Path, expect: type | None = dict, max_bytes: int = JSON_MAX_BYTES) -> object:
    """A JSON file, read once with a size cap; ``expect`` (default: an object) is the type its top level must
    have. Every failure (missing, a folder, too large, not UTF-8, malformed, too deep, wrong type) is one
    ``UserError`` line naming the file: the one way the workbench reads JSON."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            payload = handle.read(max_bytes + 1)
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a JSON file") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or first_line(exc)}") from None
    if len(payload) > max_bytes:
        raise UserError(f"{path} is larger than {max_bytes >> 20} MiB; refusing to read it as JSON")
    try:
        text = payload.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text, so not a JSON file") from None
    value = parse_json(text, str(path))
    if expect is not None and not isinstance(value, expect):
        wanted = _JSON_NAMES.get(expect, expect.__name__)
        raise UserError(
            f"{path} holds a JSON {_JSON_NAMES.get(type(value), type(value).__name__)}, not a JSON {wanted}"
        )
    return value


_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def dumps_json(value: object) -> bytes:
    """``value`` as strict, indented JSON with a final newline; a NaN or infinity anywhere is a ``ValueError``
    (a bug upstream: figures are checked finite before they are written)."""
    return (json.dumps(value, indent=2, allow_nan=False) + "\n").encode()


def write_json(path: Path, value: object) -> None:
    """``dumps_json(value)`` written atomically."""
    write_atomic(path, dumps_json(value))


def jsonl_gz(records: list[dict]) -> bytes:
    """Deterministic gzip (mtime 0), so the shipped files' sha256 only changes when their text does."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    return buffer.getvalue()


def fingerprint_tensor(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's shape, dtype and bytes: identifies windows or weights exactly."""
    digest = hashlib.sha256(f"{tuple(tensor.shape)}|{tensor.dtype}".encode())
    digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-dim too
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ``jsonschema`` is imported without its optional IRI format checker: when ``rfc3987_syntax`` is installed
# (Jupyter brings it), importing jsonschema builds ~40 Earley parsers, 2-20 s per process
# (python-jsonschema/jsonschema#1428). No workbench schema uses the ``iri`` formats.
SKIPPED = "rfc3987_syntax"


def import_jsonschema() -> types.ModuleType:
    """The ``jsonschema`` module (already imported, or imported now without ``rfc3987_syntax``)."""
    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    refuse = SKIPPED not in sys.modules
    if refuse:
        sys.modules[SKIPPED] = None  # type: ignore[assignment]  # an import of a None entry raises ImportError
    try:
        return importlib.import_module("jsonschema")
    finally:
        if refuse:
            del sys.modules[SKIPPED]
