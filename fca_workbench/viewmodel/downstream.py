"""The results view's downstream table: an audit folder's ``downstream.json`` (``fca eval``), when it has one and
it is of the audit's model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fca_workbench.data.windows import file_stamp
from fca_workbench.downstream.table import downstream_table, gap_table
from fca_workbench.foundation.files import inside_folder
from fca_workbench.results.frames import read_downstream
from fca_workbench.results.layout import DOWNSTREAM_FILE

if TYPE_CHECKING:
    import pandas as pd


def downstream_tables(folder: Path, audit: dict) -> list[pd.DataFrame]:
    """``[figures, gaps]`` tables of the ``downstream.json`` beside ``audit`` (its folder's ``audit.json``), read
    only inside the folder and checked (``frames.read_downstream``: its schema, and of the audit's model), or
    ``[]`` without one."""
    path = inside_folder(folder, DOWNSTREAM_FILE, "the results view")
    if not path.is_file():
        return []
    downstream = read_downstream(path, audit)
    return [downstream_table([downstream]), gap_table([downstream])]


def downstream_version(folder: Path) -> tuple[int, int] | None:
    """(size, mtime) of the folder's ``downstream.json``, None without one: with the audit's own version, what
    the view's rendered tables are kept by, so an ``fca eval`` that finishes while the view is open shows."""
    return file_stamp(folder / DOWNSTREAM_FILE)
