"""Where the shipped files are, in a source checkout and in an installed wheel.

A checkout keeps them at the top level (``data/``, ``notebooks/``, ``dashboards/``), where people open them.
The wheel maps those folders into the package as ``fca_workbench/shipped/<name>`` (``pyproject.toml``) and
leaves out the 34 MB of checkpoints; an installed copy reads them through ``importlib.resources``. The
bundled copy wins when it exists, so a wheel never reaches for a folder beside site-packages.
"""

import fnmatch
import os
import shutil
import tarfile
from importlib.resources import files
from pathlib import Path, PurePosixPath

from fca_workbench.errors import UserError
from fca_workbench.files import atomic_path

CHECKOUT = Path(__file__).resolve().parent.parent
CHECKPOINTS_ENV = "FCA_CHECKPOINTS"
CHECKPOINTS_IN_SOURCE = ("data", "checkpoints")  # where a checkout or an unpacked sdist keeps them
LEFT_BEHIND = (".*", "trainer_state.pt")  # lock files and optimizer state are never shipped
CHECKPOINT_CONFIG = "config.json"  # what makes a folder a checkpoint folder


def is_checkpoint(folder: Path) -> bool:
    """True for a folder that holds a checkpoint's ``config.json`` (its weights are checked when loaded)."""
    return (Path(folder) / CHECKPOINT_CONFIG).is_file()


def check_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path``, or a one-line ``UserError`` saying it is missing or is not one: the
    check every command and loader makes before reading a checkpoint."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"checkpoint folder not found: {folder}")
    if not is_checkpoint(folder):
        raise UserError(f"not a checkpoint folder (no {CHECKPOINT_CONFIG}): {folder}")
    return folder


def shipped(name: str) -> Path:
    """The folder ``data``, ``notebooks`` or ``dashboards``: bundled in the wheel, else the checkout's."""
    bundled = files("fca_workbench").joinpath("shipped").joinpath(name)
    return Path(str(bundled)) if bundled.is_dir() else CHECKOUT / name


def in_checkout() -> bool:
    """True when running from a source checkout (editable install or ``PYTHONPATH``), not a wheel."""
    return not files("fca_workbench").joinpath("shipped").is_dir()


def results_root() -> Path:
    """Default parent of results: the checkout's ``results/``, or ``results/`` in the current folder (never
    inside site-packages)."""
    return CHECKOUT / "results" if in_checkout() else Path.cwd() / "results"


def checkpoints_dir() -> Path:
    """The shipped checkpoints: ``$FCA_CHECKPOINTS`` if set, else ``data/checkpoints`` of the checkout; a wheel
    does not carry them, and says in one line where to get them."""
    if os.environ.get(CHECKPOINTS_ENV):
        try:
            return Path(os.environ[CHECKPOINTS_ENV]).expanduser()
        except RuntimeError:  # ``~user`` of no such user
            raise UserError(
                f"{CHECKPOINTS_ENV}={os.environ[CHECKPOINTS_ENV]} names a home folder that does not exist"
            ) from None
    if in_checkout():
        return CHECKOUT / "data" / "checkpoints"
    raise UserError(
        "the shipped checkpoints are not in the installed package: copy them out of the sdist with "
        f"'fca data checkpoints --from fca_workbench-*.tar.gz --into DIR' and set {CHECKPOINTS_ENV}=DIR, "
        "or name your own checkpoints (fca reproduce --config, fca dashboard --registry)"
    )


def copy_checkpoints(source: str | Path | None, into: Path) -> list[str]:
    """Copy ``data/checkpoints/*`` out of an sdist (``.tar.gz``) or a source folder into the new folder
    ``into``, through a temporary sibling renamed at the end (``files.atomic_path``); returns the checkpoint
    names."""
    if source is None:
        if not in_checkout():
            raise UserError(
                "the installed package holds no checkpoints: pass --from fca_workbench-*.tar.gz "
                "(the sdist) or --from a source checkout"
            )
        source = CHECKOUT
    source, into = Path(source), Path(into)
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise UserError(f"{into} already exists and is not an empty folder")
    if source.is_dir():
        folder = source.joinpath(*CHECKPOINTS_IN_SOURCE)
        if not folder.is_dir():
            raise UserError(f"no {'/'.join(CHECKPOINTS_IN_SOURCE)} folder in {source}")
    elif not (source.is_file() and tarfile.is_tarfile(source)):
        raise UserError(f"--from must be an sdist (.tar.gz) or a source folder: {source}")
    with atomic_path(into) as tmp:
        if source.is_dir():
            shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
        else:
            extract_checkpoints(source, tmp)
        names = sorted(p.name for p in tmp.iterdir() if is_checkpoint(p)) if tmp.is_dir() else []
        if not names:
            raise UserError(f"no checkpoints under {'/'.join(CHECKPOINTS_IN_SOURCE)} in {source}")
        if into.exists():
            into.rmdir()
    return names


def extract_checkpoints(sdist: Path, folder: Path) -> None:
    """The regular files under ``<top>/data/checkpoints/`` of the sdist, written below ``folder`` (members
    are read, never extracted by their own names, so no path in the archive can point elsewhere)."""
    with tarfile.open(sdist) as archive:
        for member in archive:
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or parts[1:3] != CHECKPOINTS_IN_SOURCE or len(parts) < 4:
                continue
            relative = parts[3:]
            if ".." in relative or any(fnmatch.fnmatch(part, pattern) for part in relative for pattern in LEFT_BEHIND):
                continue
            target = folder.joinpath(*relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            stream = archive.extractfile(member)
            assert stream is not None  # member.isfile()
            with stream, open(target, "wb") as out:
                shutil.copyfileobj(stream, out)
