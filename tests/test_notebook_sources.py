"""The notebooks' sources: percent-format Python (jupytext) that papermill can run, ruff and mypy check, and that
spells no condition name (they import them from the vocabulary); what a notebook writes by default lies under the
folder it runs in."""

import ast
import re
import sys
from pathlib import Path

import jupytext
import pytest

from fca_workbench.notebooks import reproduce
from fca_workbench.notebooks.notebook_execution import notebook_parameters, notebook_stem, read_notebook
from fca_workbench.notebooks.notebook_run import NotebookRun
from fca_workbench.results.conditions import ALL_CONDITIONS

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("*.py"))


def test_the_sources_are_the_notebooks_reproduce_knows():
    assert {p.stem for p in SOURCES} == {*reproduce.PAPER_NOTEBOOKS, reproduce.EXPLORE_NOTEBOOK}
    assert not list((ROOT / "notebooks").glob("*.ipynb"))  # one source per notebook: converted when it runs
    assert [notebook_stem(n) for n in ("01_variation", "01_variation.py", "01_variation.ipynb")] == ["01_variation"] * 3


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_each_source_is_a_parameterised_notebook_of_the_project_kernel(path):
    text = path.read_text()
    assert "\n# %%" in text and text.startswith("# ---\n# jupyter:")  # percent format, with its header
    assert jupytext.read(path).metadata.kernelspec.name == reproduce.KERNEL_NAME  # as JupyterLab opens it
    nb = read_notebook(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in nb.cells) == 1
    assert "out" in notebook_parameters(path)  # papermill finds the parameters cell; fca reproduce sets out
    assert jupytext.writes(nb, fmt="py:percent").split("# %%", 1)[1] == text.split("# %%", 1)[1]  # round trip


def spelled_names(path: Path) -> list[str]:
    """``file:line`` of every string constant in ``path`` that is a condition name, or quotes one (a pandas
    query): a notebook imports the names from ``fca_workbench.results.conditions``."""
    names = set(ALL_CONDITIONS)
    quoted = re.compile("['\"](" + "|".join(map(re.escape, ALL_CONDITIONS)) + ")['\"]")
    return [
        f"{path.name}:{node.lineno} {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in names or quoted.search(node.value))
    ]


def test_no_notebook_spells_a_condition_name():
    assert [hit for path in SOURCES for hit in spelled_names(path)] == []


def test_the_scan_finds_a_spelled_name(tmp_path):
    path = tmp_path / "copy.py"
    path.write_text("t = table.query(\"condition != 'correct'\")\nc = 'cross_input'\nok = f'{x}_correct'\n")
    assert sorted(hit.split()[0] for hit in spelled_names(path)) == ["copy.py:1", "copy.py:2"]


def test_ruff_and_mypy_check_the_notebooks():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "notebooks" in config["tool"]["mypy"]["files"]
    excluded = config["tool"]["ruff"].get("exclude", []) + config["tool"]["ruff"].get("extend-exclude", [])
    assert not any(pattern.startswith("notebooks") for pattern in excluded)


def test_a_notebook_writes_under_the_folder_it_runs_in(tmp_path, monkeypatch):
    """A notebook copied into a user's folder writes its tables, figures, audits and cache there, not into the
    workbench's checkout."""
    monkeypatch.chdir(tmp_path)
    run = NotebookRun()
    assert run.out == tmp_path / "results" / "notebooks"
    assert run.audits == run.out / "audits" and run.cache == tmp_path / "results" / "cache"
    given = NotebookRun(out="mine", cache="shared")
    assert (given.out, given.cache) == (tmp_path / "mine", tmp_path / "shared")
