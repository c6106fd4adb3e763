"""Output folders: the workbench writes into folders, and never over a file it did not write.

Every command checks its ``--out`` before any work: a path that is a file is refused; a result file
already there is replaced only when it is one the workbench wrote (its JSON ``schema``); and
``fca reproduce --overwrite`` writes only over a folder that carries the marker file a reproduce run
leaves in it.
"""

from collections.abc import Callable
from pathlib import Path
from typing import cast

from fca_workbench.errors import UserError
from fca_workbench.files import import_jsonschema, read_json, write_atomic
from fca_workbench.results.layout import RESULTS_MARKER


def output_folder(out: str | Path) -> Path:
    """``out`` resolved (so ``.`` has a name), refused when it exists and is not a folder."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    return out


def refuse_foreign(path: Path, schema: str, validate: Callable[[dict], object] | None = None) -> None:
    """Refuse to replace ``path`` unless it is a JSON file of ``schema`` (and passes ``validate``)."""
    if not path.exists():
        return
    jsonschema = import_jsonschema()  # slow to import; only needed when there is a file to judge

    try:
        content = read_json(path, expect=None)
        ours = isinstance(content, dict) and content.get("schema") == schema
        if ours and validate is not None:
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
