"""Build hook: the package's data files are exactly the ones named in ``package_data.txt``.

A glob in ``[tool.setuptools.package-data]`` ships whatever a checkout holds (an untracked credentials file, a
scratch run with its optimizer state, a link to a file outside the tree); an explicit list ships only what was
committed. Every listed path must be a plain file reached through no symbolic link, inside the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from setuptools import setup
from setuptools.command.build_py import build_py
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


if __name__ == "__main__":
    setup(cmdclass={"build_py": ListedDataBuildPy})
