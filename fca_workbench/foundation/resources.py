"""Where the shipped files are, in a source checkout and in an installed wheel.

A checkout keeps them at the top level (``data/``, ``notebooks/``, ``dashboards/``), where people open them.
The wheel maps those folders into the package as ``fca_workbench/shipped/<name>`` (``pyproject.toml``), the
shipped checkpoints (``data/checkpoints``, 46 MB) included, so ``fca reproduce`` and ``fca dashboard`` work
with no second download; an installed copy reads them through ``importlib.resources``. The bundled copy wins
when it exists, so a wheel never reaches for a folder beside site-packages.
"""

import fnmatch
import os
import shutil
import stat
import tarfile
import zlib
from importlib.resources import files
from pathlib import Path, PurePosixPath

from fca_workbench.foundation.checkpoint import TRAIN_STATE_FILE, is_checkpoint
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import atomic_folder, inside_folder

CHECKOUT = Path(__file__).resolve().parents[2]  # fca_workbench/foundation/resources.py
CHECKPOINTS_ENV = "FCA_CHECKPOINTS"
CHECKPOINTS_IN_SOURCE = ("data", "checkpoints")  # where a checkout or an unpacked sdist keeps them
LEFT_BEHIND = (".*", TRAIN_STATE_FILE)  # lock files and optimizer state are never shipped
# A copy of checkpoints claiming more bytes, or more files and folders, is refused before anything is written
# (the shipped ones take 46 MB in under 100 entries; a small archive can claim gigabytes or a million files).
CHECKPOINTS_MAX_BYTES = 512 << 20
CHECKPOINTS_MAX_FILES = 10_000


def shipped(name: str) -> Path:
    """The folder ``data``, ``notebooks`` or ``dashboards``: bundled in the wheel, else the checkout's."""
    bundled = files("fca_workbench").joinpath("shipped").joinpath(name)
    return Path(str(bundled)) if bundled.is_dir() else CHECKOUT / name


def shipped_root() -> Path:
    """The folder that holds ``data/``, ``notebooks/`` and ``dashboards/``: the wheel's ``shipped/``, else the
    checkout."""
    return shipped("data").parent


def in_checkout() -> bool:
    """True when running from a source checkout (editable install or ``PYTHONPATH``), not a wheel."""
    return not files("fca_workbench").joinpath("shipped").is_dir()


def checkpoints_dir() -> Path:
    """The shipped checkpoints: ``$FCA_CHECKPOINTS`` if set, else ``data/checkpoints`` of the wheel or of the
    checkout; a package installed without them says in one line where to get them."""
    if os.environ.get(CHECKPOINTS_ENV):
        try:
            return Path(os.environ[CHECKPOINTS_ENV]).expanduser()
        except RuntimeError:  # ``~user`` of no such user
            raise UserError(
                f"{CHECKPOINTS_ENV}={os.environ[CHECKPOINTS_ENV]} names a home folder that does not exist"
            ) from None
    folder = shipped_root().joinpath(*CHECKPOINTS_IN_SOURCE)
    if folder.is_dir():
        return folder
    raise UserError(
        "the shipped checkpoints are not in the installed package: copy them out of the sdist with "
        f"'fca data checkpoints --from fca_workbench-*.tar.gz --into DIR' and set {CHECKPOINTS_ENV}=DIR, "
        "or name your own checkpoints (fca reproduce --config, fca dashboard --registry)"
    )


def copy_checkpoints(source: str | Path | None, into: Path) -> list[str]:
    """Copy ``data/checkpoints/*`` out of an sdist (``.tar.gz``) or a source folder (default: the installed
    package's or the checkout's) into the new folder ``into``, through a fresh private folder renamed at the
    end (``files.atomic_folder``: removed on any error); returns the checkpoint names. Links are never
    followed, and no more than ``CHECKPOINTS_MAX_BYTES`` in ``CHECKPOINTS_MAX_FILES`` is written."""
    if source is None:
        source = shipped_root()
        if not source.joinpath(*CHECKPOINTS_IN_SOURCE).is_dir():
            raise UserError(
                "the installed package holds no checkpoints: pass --from fca_workbench-*.tar.gz "
                "(the sdist) or --from a source checkout"
            )
    source, into = Path(source), Path(into)
    if into.is_symlink() or (into.exists() and (not into.is_dir() or any(into.iterdir()))):
        raise UserError(f"{into} already exists and is not an empty folder")
    folder = source.joinpath(*CHECKPOINTS_IN_SOURCE)
    if source.is_dir() and not folder.is_dir():
        raise UserError(f"no {'/'.join(CHECKPOINTS_IN_SOURCE)} folder in {source}")
    if source.is_dir():
        inside_folder(source, "/".join(CHECKPOINTS_IN_SOURCE), "--from")
    if not source.is_dir() and not _is_tarfile(source):
        raise UserError(f"--from must be an sdist (.tar.gz) or a source folder: {source}")
    try:
        with atomic_folder(into) as tmp:
            if source.is_dir():
                copy_folder(folder, tmp)
            else:
                extract_checkpoints(source, tmp)
            names = sorted(p.name for p in tmp.iterdir() if is_checkpoint(p))
            if not names:
                raise UserError(f"no checkpoints under {'/'.join(CHECKPOINTS_IN_SOURCE)} in {source}")
    except OSError as exc:  # the folder beside --into cannot be made, or renamed into place
        raise UserError(f"cannot write the checkpoints to {into}: {exc.strerror or first_line(exc)}") from None
    return names


def _is_tarfile(path: Path) -> bool:
    try:
        return path.is_file() and tarfile.is_tarfile(path)
    except (OSError, EOFError, zlib.error):
        return False


def _left_behind(relative: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in relative for pattern in LEFT_BEHIND)


def _check_total(total: int, count: int, source: Path) -> None:
    """Refuse to copy more bytes, or more files and folders, than the caps, before anything is written."""
    if total > CHECKPOINTS_MAX_BYTES or count > CHECKPOINTS_MAX_FILES:
        raise UserError(
            f"the checkpoints in {source} take at least {total:,} bytes in {count:,} files and folders, more "
            f"than the {CHECKPOINTS_MAX_BYTES:,} bytes or {CHECKPOINTS_MAX_FILES:,} entries the workbench copies; "
            "nothing was copied"
        )


def copy_folder(folder: Path, into: Path) -> None:
    """The files below ``folder`` copied into the existing folder ``into``: a link or a special file (a
    device reads without end) is refused before anything is copied; links are copied as links, never followed,
    and a link that appeared during the copy is refused too."""
    entries = [Path(root, name) for root, dirs, names in os.walk(folder) for name in [*dirs, *names]]
    kept = [path for path in entries if not _left_behind(path.relative_to(folder).parts)]
    for path in kept:
        _refuse_link_or_special(path, path)
    _check_total(sum(path.lstat().st_size for path in kept if path.is_file()), len(kept), folder)
    try:
        shutil.copytree(folder, into, symlinks=True, ignore=shutil.ignore_patterns(*LEFT_BEHIND), dirs_exist_ok=True)
    except (shutil.Error, OSError) as exc:  # shutil.Error: a list of (source, target, why), one per file
        why = exc.args[0][0][2] if isinstance(exc, shutil.Error) and exc.args and exc.args[0] else exc
        raise UserError(f"cannot copy the checkpoints in {folder}: {first_line(str(why))}") from None
    for root, dirs, names in os.walk(into):
        for name in [*dirs, *names]:
            copied = Path(root, name)
            _refuse_link_or_special(copied, folder / copied.relative_to(into))


def _refuse_link_or_special(path: Path, shown: Path) -> None:
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        raise UserError(
            f"{shown} is a link (to {os.readlink(path)}); checkpoints are copied only as regular files, "
            "never through links"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UserError(f"{shown} is not a regular file; checkpoints are copied only as regular files")


def extract_checkpoints(sdist: Path, folder: Path) -> None:
    """The files under ``<top>/data/checkpoints/`` of the sdist, written below ``folder`` by tarfile's
    ``data`` filter (nothing outside ``folder``, no special files, safe modes); members elsewhere, climbing
    out with ``..`` or named like lock files are left out, a link is refused, and the sizes the members
    declare must fit in the caps before anything is written."""
    try:
        with tarfile.open(sdist) as archive:
            chosen, total = [], 0
            for member in archive:  # headers one by one: a bomb is refused at its first oversized member
                renamed = _renamed(member, sdist)
                if renamed is not None:
                    chosen.append(renamed)
                    total += renamed.size if renamed.isfile() else 0
                    _check_total(total, len(chosen), sdist)
            if not _ended(archive):
                raise UserError(f"{sdist} ends after a member, without the end-of-archive block: truncated?")
            archive.extractall(folder, members=chosen, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise UserError(
            f"cannot extract the checkpoints from {sdist} (damaged or truncated?): {first_line(exc)}"
        ) from None


def _ended(archive: tarfile.TarFile) -> bool:
    """Whether the members just read were followed by the end-of-archive block. tarfile reads a plain .tar cut
    between two members as a shorter archive without complaint (a cut .tar.gz fails its gzip trailer)."""
    assert archive.fileobj is not None
    archive.fileobj.seek(archive.offset)
    return archive.fileobj.read(tarfile.BLOCKSIZE) == bytes(tarfile.BLOCKSIZE)


def _renamed(member: tarfile.TarInfo, sdist: Path) -> tarfile.TarInfo | None:
    """``member`` named relative to ``data/checkpoints/``, or None when it is not one of the checkpoints' files."""
    parts = PurePosixPath(member.name).parts
    if parts[1:3] != CHECKPOINTS_IN_SOURCE or len(parts) < 4:
        return None
    relative = parts[3:]
    if ".." in relative or _left_behind(relative):
        return None
    if not (member.isfile() or member.isdir()):
        kind = "a link" if member.issym() or member.islnk() else "not a regular file"
        raise UserError(f"{member.name} in {sdist} is {kind}; checkpoints are copied only as regular files")
    return member.replace(name="/".join(relative), deep=False)
