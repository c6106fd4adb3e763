"""The CSV of every table the dashboard offers for download: ``tabular.to_csv``'s, safe to open in a spreadsheet
(see ``results.tabular``), the same columns and rows as ``fca reproduce``'s ``tables/*.csv``."""

from fca_workbench.results.tabular import spreadsheet_cell
from fca_workbench.results.tabular import to_csv as download_csv

__all__ = ["download_csv", "spreadsheet_cell"]
