"""Time to the first figure of the explorer notebook (notebooks/explore.py) from a cold cache, on the notebook's default settings.

    .venv/bin/python benchmarks/bench_explore.py [--repeats 1]

Runs the notebook as Run All does (nbclient, kernel ``fca-workbench``) with ``out``, ``audits`` and ``cache``
in a fresh temporary folder, so nothing is reused. The first figure is drawn by the last statement of the
widget cell (``render()``), so the time to it is taken at that cell's reply, counted from before the kernel
is started; every later cell is timed too. Goal (issue 12): under 30 s on the 2-core reference machine.
Prints one JSON line per repeat, with the load average at the start.
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from fca_workbench.notebooks.notebook_execution import read_notebook
from fca_workbench.notebooks.reproduce import KERNEL_NAME, NOTEBOOK_DIR

WIDGET_CELL = "display(widgets.VBox("  # the cell whose last statement draws the first figure


def time_notebook(folder: Path) -> dict:
    nb = read_notebook(NOTEBOOK_DIR / "explore.py")
    parameters = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(
        parameters + 1,
        nbformat.v4.new_code_cell(
            f"out = {str(folder / 'out')!r}\naudits = {str(folder / 'audits')!r}\ncache = {str(folder / 'cache')!r}"
        ),
    )
    replies: dict[int, float] = {}
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout=600,
        resources={"metadata": {"path": str(folder)}},
        on_cell_executed=lambda cell, cell_index, execute_reply: replies.setdefault(
            cell_index, time.perf_counter() - start
        ),
    )
    client.execute()
    widget_cell = next(i for i, c in enumerate(nb.cells) if WIDGET_CELL in c.source)
    return {
        "first_figure_s": round(replies[widget_cell], 1),
        "all_cells_s": round(max(replies.values()), 1),
        "cells_s": {i: round(t, 1) for i, t in sorted(replies.items())},
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeats):
        load = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="bench-explore-") as tmp:
            result = time_notebook(Path(tmp))
        print(json.dumps({**result, "load_average_at_start": load}))


if __name__ == "__main__":
    main()
