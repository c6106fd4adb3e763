"""Build hooks: the package's data files are exactly the ones named in ``package_data.txt``, and the sdist holds
only committed files.

A glob in ``[tool.setuptools.package-data]`` ships whatever a checkout holds (an untracked credentials file, a
scratch run with its optimizer state, a link to a file outside the tree); an explicit list ships only what was
committed. Every listed path must be a plain file reached through no symbolic link, inside the checkout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePosixPath

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.errors import SetupError

DATA_LIST = "package_data.txt"


def listed_data_files(root: Path) -> list[str]:
    """The paths ``DATA_LIST`` names (relative, POSIX), each checked to be a plain file with no link on its way."""
    names = []
    for number, line in enumerate((root / DATA_LIST).read_text(encoding="utf-8").splitlines(), start=1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or any(c in name for c in "*?[]\\"):
            raise SetupError(f"{DATA_LIST}:{number}: {name!r} is not a plain relative path inside the checkout")
        here = root
        for part in path.parts:
            here = here / part
            if here.is_symlink():
                raise SetupError(f"{DATA_LIST}:{number}: {here.relative_to(root)} is a symbolic link; not shipped")
        if not here.is_file():
            raise SetupError(f"{DATA_LIST}:{number}: {name} is not a file of this checkout")
        names.append(path.as_posix())
    return names


class ListedDataBuildPy(build_py):
    """``build_py`` whose data files come from ``DATA_LIST`` (the sdist takes them from here too)."""

    def find_data_files(self, package: str, src_dir: str) -> list[str]:
        folders = {name: Path(self.get_package_dir(name)).as_posix() for name in self.packages or ()}
        owned = []
        for name in listed_data_files(Path.cwd()):
            # the deepest package whose folder holds the file owns it
            holders = [p for p, folder in folders.items() if name.startswith(f"{folder}/")]
            if holders and max(holders, key=lambda p: len(folders[p])) == package:
                owned.append(os.path.join(src_dir, os.path.relpath(name, folders[package])))
        return owned


def committed_files(root: Path) -> set[str] | None:
    """``git ls-files`` of ``root``; None where it is no git checkout (an sdist being built into a wheel)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return {name for name in listed.stdout.decode().split("\0") if name}


class CommittedSdist(sdist):
    """An sdist whose every file, in a git checkout, is a committed one (or setuptools' own egg-info): the folders
    MANIFEST.in grafts whole (tests, benchmarks, studies, scripts, docs) would otherwise take an untracked token or
    scratch file lying among them."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        committed = committed_files(Path.cwd())
        if committed is not None:
            files = [name for name in files if Path(name).as_posix() in committed or ".egg-info" in name]
        super().make_release_tree(base_dir, files)


if __name__ == "__main__":
    setup(cmdclass={"build_py": ListedDataBuildPy, "sdist": CommittedSdist})
