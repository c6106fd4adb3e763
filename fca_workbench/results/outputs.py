"""Output folders: the workbench writes into folders, and never over a file it did not write.

Every command checks its ``--out`` before any work: a path that is a file is refused; a folder is written
into only when it is missing, empty or carries the marker its command left there (``check_output``: so a
user's own ``per_token_nll.csv.gz`` or cache shard in a folder the workbench did not make is never replaced
or deleted); a result file already there is replaced only when it is one the workbench wrote (its JSON
``schema``); and ``fca reproduce --overwrite`` writes only over a folder that carries the marker file a
reproduce run leaves in it.
"""

from collections.abc import Callable
from pathlib import Path
from typing import cast

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import check_folder_path, import_jsonschema, read_json, write_atomic
from fca_workbench.results.layout import LOCK_FILE, OUTPUT_MARKER, RESULTS_MARKER

MARKER_MAX_BYTES = 4096


def output_folder(out: str | Path) -> Path:
    """``out`` resolved (so ``.`` has a name), refused when it or a folder it would be made in is a file."""
    return check_folder_path(Path(out).resolve(), "--out")


def check_output(out: Path, command: str, adopt: Callable[[Path], bool]) -> Path:
    """``out`` when ``command`` (``fca audit``) may write into it: missing, empty (its lock aside), marked by
    ``command`` (``mark_output``), or unmarked but one ``adopt`` knows as written by an earlier version of the
    workbench; anything else is one line, before any work."""
    if not out.is_dir():
        return out
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
    if not entries:
        return out
    writer = marker_command(out / OUTPUT_MARKER)
    if writer == command or (writer is None and OUTPUT_MARKER not in entries and adopt(out)):
        return out
    if writer is not None:
        raise UserError(f"--out {out} was written by {writer}, not {command}; choose another --out")
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise UserError(
        f"--out {out} holds files {command} did not write ({shown}); choose a new or empty folder for --out"
    )


def marker_command(marker: Path) -> str | None:
    """The command named on the first line of an output folder's marker (None: no readable marker; a link is
    none, its target lies outside the folder)."""
    if marker.is_symlink():
        return None
    try:
        with open(marker, "rb") as handle:
            first = handle.read(MARKER_MAX_BYTES).decode("utf-8").partition("\n")[0]
    except (OSError, UnicodeDecodeError):
        return None
    return first if first.startswith("fca ") else None


def mark_output(out: Path, command: str) -> None:
    """Mark ``out`` as ``command``'s output folder, before the first file is written into it."""
    if marker_command(out / OUTPUT_MARKER) != command:
        write_atomic(out / OUTPUT_MARKER, f"{command}\nwrites over the files it wrote here, and only here\n".encode())


def refuse_foreign(
    path: Path, schema: str, validate: Callable[[dict], object] | None = None, older: tuple[str, ...] = ()
) -> None:
    """Refuse to replace ``path`` unless it is a JSON file of ``schema`` (and passes ``validate``), or of one of the
    ``older`` versions of it this workbench wrote."""
    if not path.exists():
        return
    jsonschema = import_jsonschema()  # slow to import; only needed when there is a file to judge

    try:
        content = read_json(path, expect=None)
        version = content.get("schema") if isinstance(content, dict) else None
        ours = version == schema or version in older
        if version == schema and validate is not None:
            validate(cast(dict, content))
    except (UserError, RecursionError, jsonschema.ValidationError):  # unreadable, not JSON, not valid: not ours
        ours = False
    if not ours:
        raise UserError(
            f"{path} exists and is not a {schema} file this workbench wrote; move it away or choose another --out"
        )


def mark_results(folder: Path) -> None:
    write_atomic(folder / RESULTS_MARKER, b"written by fca reproduce; --overwrite may write over this folder\n")


def is_results(folder: Path) -> bool:
    return (folder / RESULTS_MARKER).is_file()
