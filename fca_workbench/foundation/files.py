"""Files the workbench writes and reads: atomic writes, content hashes, and JSON Schema validation.

Every file is written through ``write_atomic`` (bytes) or ``atomic_path`` (a writer that needs a path): a
temporary sibling, then a rename, so a crash never leaves a half-written result; tensors and files are
identified by sha256 of exactly their bytes. Every JSON file is read through ``read_json`` (bounded in
size, any malformation one line naming the file) and written through ``write_json`` (strict JSON: a NaN or
an infinity is refused, never written as a bare ``NaN`` token that other JSON readers reject). A file that
a library parses (a tokenizer, weights, a pickled state, a CSV) is read inside ``reading``, the one boundary
that turns the library's own exceptions into one line; a safetensors header is checked by safetensors itself
(``safetensors_shapes``) before anything allocates for what it declares. A file one file
names (a shard an index lists, a link in a folder) is read only from inside that folder (``inside_folder``,
``check_links_inside``).
"""

import contextlib
import csv
import gzip
import hashlib
import importlib
import io
import json
import math
import os
import pickle
import reprlib
import shutil
import struct
import sys
import tarfile
import tempfile
import types
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError, safe_open

from fca_workbench.foundation.errors import UserError, first_line, one_line


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


def move_files(staging: Path, out: Path) -> list[Path]:
    """Every file under ``staging`` moved to the same place under ``out`` (each rename atomic, replacing a file
    there), then ``staging`` removed, and its parent too once empty; their new paths."""
    moved = []
    for path in sorted(p for p in staging.rglob("*") if p.is_file()) if staging.is_dir() else []:
        target = out / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):  # the last notebook to end removes the staging folder (others: not empty)
        staging.parent.rmdir()
    return moved


JSON_MAX_BYTES = 64 << 20  # far above any config, index, manifest or audit.json the workbench meets


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a number too large for a float, read as infinity
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def parse_json(text: str | bytes, source: str) -> object:
    """``text`` parsed as strict JSON (no ``NaN``/``Infinity``); any malformation, nesting too deep for the
    parser included, is one ``UserError`` line naming ``source``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise UserError(f"{source} is nested too deeply to be read as JSON") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{source} is not valid JSON: {first_line(exc)}") from None


def read_text(path: Path, max_bytes: int, kind: str) -> str:
    """The UTF-8 text of a small file (a BOM dropped), read once with a size cap; missing, a folder, too
    large or not UTF-8 is one ``UserError`` line naming the file and the ``kind`` of file it should be."""
    try:
        with open(path, "rb") as handle:
            payload = handle.read(max_bytes + 1)
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not {kind}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or first_line(exc)}") from None
    if len(payload) > max_bytes:
        raise UserError(f"{path} is larger than {_size_text(max_bytes)}; refusing to read it as {kind}")
    try:
        return payload.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text, so not {kind}") from None


def _size_text(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} bytes"


def read_json(path: Path, expect: type | None = dict, max_bytes: int = JSON_MAX_BYTES) -> object:
    """A JSON file, read once with a size cap; ``expect`` (default: an object) is the type its top level must
    have. Every failure (missing, a folder, too large, not UTF-8, malformed, too deep, wrong type) is one
    ``UserError`` line naming the file: the one way the workbench reads JSON."""
    path = Path(path)
    value = parse_json(read_text(path, max_bytes, "a JSON file"), str(path))
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


def canonical_json(value: object) -> str:
    """``value`` as compact, key-sorted, strict JSON: the same value always gives the same text (metadata
    stored inside a file and compared byte for byte)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def write_json(path: Path, value: object) -> None:
    """``dumps_json(value)`` written atomically."""
    write_atomic(path, dumps_json(value))


# What libraries raise on a file that is malformed: parse errors, wrong types or keys in what was parsed,
# truncation (``struct.error`` from torch's unpickler), nesting too deep, shapes that do not fit (torch's
# load_state_dict). The Rust ``tokenizers`` raises a bare ``Exception``, caught as that exact type only, so
# a real bug of any other type keeps its traceback.
MALFORMED = (
    OSError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    ArithmeticError,
    RecursionError,
    RuntimeError,
    csv.Error,
    pickle.UnpicklingError,
    struct.error,
    zipfile.BadZipFile,
    tarfile.TarError,
    zlib.error,
    SafetensorError,
)


@contextlib.contextmanager
def reading(what: str, advice: str = "") -> Iterator[None]:
    """The one boundary of a loader that hands a file to a library: whatever the library raises on a
    malformed file becomes one ``UserError`` line: ``what`` (which names the file), the library's reason,
    then ``advice`` (what to do about it) when given."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if not isinstance(exc, MALFORMED) and type(exc) is not Exception:
            raise
        raise UserError(f"{what}: {library_reason(exc)}" + (f"; {advice}" if advice else "")) from None


REASON_CHARS = 300  # of a library's reason: torch lists every mismatched tensor


def library_reason(exc: BaseException) -> str:
    """A library's reason for refusing a file, as one short line: its first line, or all of it when the first
    line only announces the detail (torch's ``Error(s) in loading state_dict for X:``)."""
    if isinstance(exc, KeyError):
        return f"no key {first_line(exc)}"
    reason = one_line(exc) if first_line(exc).endswith(":") else first_line(exc)
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."


def relative_path(path: str | Path, folder: str | Path) -> str:
    """``path`` as seen from ``folder`` (both resolved): what a file that travels with ``folder`` records, not
    the writing machine's absolute paths."""
    return os.path.relpath(Path(path).resolve(), Path(folder).resolve())


def inside_folder(folder: Path, name: str, named_by: str) -> Path:
    """``folder / name``, refused unless it really lies inside ``folder`` once ``..``, absolute paths and
    symlinks are resolved: a loader reads nothing from elsewhere, so a checkpoint's fingerprint and an
    audit's freshness record cover everything that was loaded. ``named_by``: the file that names it. The
    one exception is the Hugging Face hub cache, whose ``models--org--name/snapshots/<revision>/`` files are
    symlinks into the same repository's ``blobs/``, and nowhere else."""
    try:
        root, resolved = folder.resolve(), (folder / name).resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte in the name, a symlink loop
        raise UserError(
            f"{named_by} in {folder} names a path that cannot be resolved ({name!r}): {first_line(exc)}"
        ) from None
    in_hub_cache = root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--")
    allowed = [root, root.parent.parent / "blobs"] if in_hub_cache else [root]
    if not any(resolved.is_relative_to(place) for place in allowed):
        raise UserError(
            f"{named_by} in {folder} points outside the folder ({name} is {resolved}); "
            "files are read only from inside it"
        )
    return folder / name


def check_folder_path(path: Path, what: str) -> Path:
    """``path`` when it is a folder or can be made one; refused in one line (``what``: the flag or folder it
    is) when it, or a folder it would be made in, is a file: ``mkdir`` would stop with ``FileExistsError`` or
    ``NotADirectoryError`` halfway through a run, after its output folder was claimed."""
    for place in (path, *path.parents):
        if os.path.lexists(place):
            if place.is_dir():
                break
            where = " is a file" if place == path else f": {place} is a file"
            raise UserError(f"{what} {path}{where}, not a folder")
    return path


def check_writable_folder(path: Path, what: str) -> Path:
    """``path`` made a folder (``check_folder_path`` first) and proved writable by making and removing a folder in
    it, or one ``UserError`` line (``what``: the flag or setting it is): ``/proc/self`` is a folder nobody can
    write in, and a run would find out only at its first write."""
    check_folder_path(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tempfile.mkdtemp(prefix=".fca-write-check-", dir=path))
    except OSError as exc:
        raise UserError(f"{what} {path} is no folder one can write in: {exc.strerror or first_line(exc)}") from None
    return path


def check_links_inside(folder: Path) -> None:
    """Refuse a folder holding a symlink (at any depth) that leads outside it: every loader (the workbench's,
    transformers', the tokenizers') opens the files of a folder by their names, so one link would read a file
    from elsewhere. Linked folders are checked, not entered."""
    for root, dirs, names in os.walk(folder):
        for path in sorted(Path(root, name) for name in [*dirs, *names]):
            if path.is_symlink():
                relative = str(path.relative_to(folder))
                inside_folder(folder, relative, relative)


SAFETENSORS_HEADER_MAX_BYTES = 100 << 20  # the safetensors library's own limit


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The names and shapes a safetensors file declares, from safetensors' own ``safe_open`` (it memory-maps the
    file and checks the header against it: its length, every tensor's dtype, shape and byte range, the data
    covered exactly), so a header claiming absurd sizes is one ``UserError`` line before anything allocates."""
    path = Path(path)
    with reading(f"cannot read {path}"):
        try:
            with safe_open(path, framework="pt") as weights:
                return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        except SafetensorError as exc:
            raise UserError(f"{path} is not a valid safetensors file ({first_line(exc)})") from None


def safetensors_header_bytes(path: Path) -> bytes | None:
    """A safetensors file's length prefix and header exactly as stored (every tensor's name, dtype, shape and
    offsets, and the metadata: what a digest of the file's layout hashes); None when the file is too short or
    claims a header longer than itself or the library's limit. Its content is checked by ``safetensors_shapes``."""
    with reading(f"cannot read {path}"), open(path, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little")
        if len(prefix) < 8 or length > SAFETENSORS_HEADER_MAX_BYTES:
            return None
        header = handle.read(length)
    return prefix + header if len(header) == length else None


def jsonl_gz(records: list[dict]) -> bytes:
    """Deterministic gzip (mtime 0), so the shipped files' sha256 only changes when their text does."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    return buffer.getvalue()


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


def schema_problem(instance: object, schema: dict) -> str | None:
    """Why ``instance`` (JSON read from a file) does not match ``schema``, as one short line (where, then
    what); None when it matches. Not ``str`` of jsonschema's error, which pretty-prints the whole instance
    (many lines, and a ``RecursionError`` for one nested deep enough)."""
    jsonschema = import_jsonschema()
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(reprlib.repr(part) if not isinstance(part, str) else part[:40] for part in exc.absolute_path)
        return f"{where or 'top level'}: {first_line(exc.message)[:PROBLEM_CHARS]}"
    except RecursionError:
        return "nested too deeply to be checked"
    return None


PROBLEM_CHARS = 200  # of a validation message, which quotes the offending value


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
