"""A table as the notebooks and the dashboard show it: a DataFrame of exact numbers plus how to read each column.

A 95% CI is kept as ``<key>_lo`` / ``<key>_hi``, a mean ± sd over seeds as ``<key>_mean`` / ``<key>_sd`` /
``<key>_n``; the DataFrame's ``attrs`` carry its name, caption and ``Column``s, which ``readable`` uses to show
CIs as ``[lo, hi]``, shares as percentages and ΔNLL with its sign. The CSV keeps full precision; Markdown
and LaTeX are rounded for reading.

Every CSV (``fca reproduce``'s ``tables/*.csv`` and the dashboard's downloads alike) is safe to open in a
spreadsheet. A spreadsheet reads a cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return
as a formula (``=HYPERLINK(...)`` in a folder name or a model's ``arch`` would run when a lab member opens the
file). Such a cell gets a leading single quote (the OWASP CSV-injection rule), which spreadsheets show as text.
A cell that is a plain decimal number (``-0.5``, ``+3``, ``1e-05``) is left as it is: a spreadsheet reads it as
that number, never as a formula, so numeric columns stay usable for sums and charts. Every text cell is quoted
and every number left bare (``csv.QUOTE_NONNUMERIC``), so a line break inside a cell never splits its row. In
Markdown a pipe is escaped and a line break becomes a space, so a cell never adds a column or a row.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fca_workbench.foundation.files import write_atomic
from fca_workbench.results.layout import TABLES_DIR

if TYPE_CHECKING:  # imported when a table is built, not by `import fca_workbench`
    import pandas as pd
    from pandas.io.formats.style import Styler


@dataclass(frozen=True)
class Column:
    """How a table column is read: kind text | int | float | delta (signed) | pct (a share as %) | sci, as one
    value, a 95% interval (``ci``: ``[lo, hi]``) or a mean ± sd over seeds (``msd``: ``{"mean", "sd", "n"}``)."""

    key: str
    header: str
    kind: str = "float"
    form: str = "value"  # value | ci | msd
    digits: int = 4
    integer: bool = False  # exact values are integers (always for kind int), e.g. FLOPs shown as sci

    @property
    def parts(self) -> list[str]:
        """The DataFrame (and CSV) columns that hold this column's exact values."""
        suffixes = {"value": [""], "ci": ["_lo", "_hi"], "msd": ["_mean", "_sd", "_n"]}[self.form]
        return [self.key + s for s in suffixes]

    def dtype(self, part: str) -> str:
        if self.kind == "text":
            return "str"
        if self.form == "msd":
            return "Int64" if part.endswith("_n") else "float64"
        return "Int64" if self.form == "value" and (self.integer or self.kind == "int") else "float64"


def make_table(name: str, caption: str, columns: list[Column], rows: list[dict]) -> pd.DataFrame:
    """The exact DataFrame of a table: one column per part of each ``Column``, ``None`` as missing."""
    import pandas as pd

    def parts(column: Column, value: Any) -> list:
        if column.form == "ci":
            return list(value) if value is not None else [None, None]
        if column.form == "msd":
            return [(value or {}).get(k) for k in ("mean", "sd", "n")]
        return [value]

    records = [[v for c in columns for v in parts(c, row.get(c.key))] for row in rows]
    frame = pd.DataFrame(records, columns=[p for c in columns for p in c.parts], dtype=object)
    frame = frame.astype({p: c.dtype(p) for c in columns for p in c.parts})
    frame.attrs.update(name=name, caption=caption, columns=columns)
    return frame


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """The table as text for reading: CIs as ``[lo, hi]``, mean ± sd, percentages and signs, the columns'
    headers; ``n/a`` where a figure is missing."""
    import pandas as pd

    cells = {c.header: [_format(c, row) for row in table.to_dict("records")] for c in table.attrs["columns"]}
    return pd.DataFrame(cells, dtype="str")


def styled(table: pd.DataFrame) -> Styler:
    """What a notebook shows: the readable table as a pandas ``Styler`` with its caption, without the index."""
    return readable(table).style.hide(axis="index").set_caption(table.attrs["caption"])


def to_markdown(table: pd.DataFrame) -> str:
    """The caption in bold, then a pipe table (``DataFrame.to_markdown``; numbers right-aligned)."""
    align = ["left" if c.kind == "text" else "right" for c in table.attrs["columns"]]
    cells = readable(table).map(lambda text: " ".join(text.replace("|", "\\|").splitlines()))
    body = cells.to_markdown(index=False, tablefmt="pipe", colalign=align, disable_numparse=True)
    return f"**{table.attrs['caption']}**\n\n{body}\n"


# Unicode in headers and cells, as pdflatex reads it (replaced after Styler's escaping)
_TEX = {"±": r"$\pm$", "Δ": r"$\Delta$", "×": r"$\times$", "²": r"$^2$", "←": r"$\leftarrow$"}


def to_latex(table: pd.DataFrame) -> str:
    """A booktabs ``table`` float (``Styler.to_latex``), caption and ``tab:<name>`` label."""
    spec = "".join("l" if c.kind == "text" else "r" for c in table.attrs["columns"])
    styler = readable(table).style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    latex = styler.to_latex(
        hrules=True,
        column_format=spec,
        position="t",
        position_float="centering",
        caption=_escape_tex(table.attrs["caption"]),
        label=f"tab:{table.attrs['name']}",
    )
    for char, tex in _TEX.items():
        latex = latex.replace(char, tex)
    return "% generated by fca_workbench.notebooks.tables; needs \\usepackage{booktabs}\n" + latex


def _escape_tex(text: str) -> str:
    """The caption, which ``Styler.to_latex`` writes as given (the cells it escapes itself)."""
    special = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
    }
    return "".join(special.get(char, char) for char in text)


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


def to_csv(table: pd.DataFrame) -> str:
    """The table's exact values as CSV (full precision; a CI as ``<key>_lo`` / ``<key>_hi``), safe to open in a
    spreadsheet: every cell through ``spreadsheet_cell`` (numeric columns without ``-inf`` are written
    untouched), text quoted, so a line break inside a cell never splits its row."""
    safe = table.copy()
    for column in safe.columns:
        values = safe[column]
        if values.dtype.kind in "iufb" and not (values.dtype.kind == "f" and (values == -math.inf).any()):
            continue
        safe[column] = values.astype(object).map(spreadsheet_cell)
    return safe.to_csv(index=False, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)


def write_table(table: pd.DataFrame, out: str | Path) -> dict[str, Path]:
    """Write ``out/tables/<name>.{csv,md,tex}`` (each to a temporary name, then renamed); returns the paths."""
    folder = Path(out) / TABLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    texts = {"csv": to_csv(table), "md": to_markdown(table), "tex": to_latex(table)}
    paths = {ext: folder / f"{table.attrs['name']}.{ext}" for ext in texts}
    for ext, text in texts.items():
        write_atomic(paths[ext], text.encode())
    return paths


def format_cell(column: Column, value: Any) -> str:
    """One value as ``readable`` writes it in ``column``: a number, a ``[lo, hi]`` pair or a ``{"mean", "sd",
    "n"}`` dict, by the column's form."""
    return _format(column, make_table("cell", "", [column], [{column.key: value}]).to_dict("records")[0])


def _format(column: Column, row: dict) -> str:
    import pandas as pd

    values = [row[p] for p in column.parts]
    if pd.isna(values[0]):
        return "n/a"
    if column.form == "ci":
        return "[" + ", ".join(_number(v, column) for v in values) + "]"
    if column.form == "msd":
        mean, sd, n = values
        if n < 2:
            return _number(mean, column)
        sd_kind = column.kind if column.kind in ("pct", "sci") else "float"
        return (
            f"{_number(mean, column)} ± {_number(sd, Column(column.key, column.header, sd_kind, digits=column.digits))}"
        )
    return _number(values[0], column)


def _number(value, column: Column) -> str:
    if column.kind == "text":
        return str(value)
    if column.kind == "int":
        return f"{int(value):,}"
    if column.kind == "pct":
        return f"{value:.{column.digits - 2}%}"
    if column.kind == "delta":
        return f"{value:+.{column.digits}f}"
    if column.kind == "sci":
        return f"{value:.{column.digits - 1}e}"
    return f"{value:.{column.digits}f}"
