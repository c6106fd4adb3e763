"""The CSV of every table the dashboard offers for download, safe to open in a spreadsheet.

A spreadsheet reads a cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return as a formula
(``=HYPERLINK(...)`` in a folder name or a model's ``arch`` would run when a lab member opens the file). Such a
cell gets a leading single quote (the OWASP CSV-injection rule), which spreadsheets show as text. A cell that is
a plain decimal number (``-0.5``, ``+3``, ``1e-05``) is left as it is: a spreadsheet reads it as that number, never
as a formula, so numeric columns stay usable for sums and charts. Every text cell is quoted and every number
left bare (``csv.QUOTE_NONNUMERIC``), so a carriage return inside a cell never splits its row; otherwise the values
are ``tables.to_csv``'s (full precision, the same columns and rows as ``fca reproduce``'s ``tables/*.csv``).
"""

from __future__ import annotations

import csv
import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_cell(value: object) -> object:
    """``value`` as a cell a spreadsheet shows and never evaluates: text beginning like a formula gets a
    leading ``'``, unless it is a plain number; a number stays a number (``-inf`` is no number to a spreadsheet:
    it becomes the text ``'-inf``)."""
    if isinstance(value, float) and math.isinf(value) and value < 0:
        return "'-inf"
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def download_csv(table: pd.DataFrame) -> str:
    """The table's exact values as CSV, every cell through ``spreadsheet_cell`` (numeric columns without
    ``-inf`` are written untouched), text quoted."""
    safe = table.copy()
    for column in safe.columns:
        values = safe[column]
        if values.dtype.kind in "iufb" and not (values.dtype.kind == "f" and (values == -math.inf).any()):
            continue
        safe[column] = values.astype(object).map(spreadsheet_cell)
    return safe.to_csv(index=False, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
