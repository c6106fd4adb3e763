"""The results view's downstream table: an audit folder's ``downstream.json`` (``fca eval``), when it has one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fca_workbench.data.windows import file_stamp
from fca_workbench.downstream.table import downstream_table, gap_table
from fca_workbench.files import inside_folder, read_json
from fca_workbench.results.frames import check_downstream
from fca_workbench.results.layout import DOWNSTREAM_FILE

if TYPE_CHECKING:
    import pandas as pd


def downstream_tables(folder: Path) -> list[pd.DataFrame]:
    """``[figures, gaps]`` tables of the folder's ``downstream.json`` (read only inside the folder, checked), or ``[]``."""
    path = inside_folder(folder, DOWNSTREAM_FILE, "the results view")
    if not path.is_file():
        return []
    downstream = read_json(path)
    check_downstream(downstream, path)
    return [downstream_table([downstream]), gap_table([downstream])]  # type: ignore[list-item]  # checked above


def downstream_version(folder: Path) -> tuple[int, int] | None:
    """(size, mtime) of the folder's ``downstream.json``, None without one: with the audit's own version, what
    the view's rendered tables are kept by, so an ``fca eval`` that finishes while the view is open shows."""
    return file_stamp(folder / DOWNSTREAM_FILE)
