"""A researcher's own parameterised notebook through ``fca reproduce --config``: named by its path (a percent-format
``.py`` or an ``.ipynb`` in their folder), given the same parameters cell values as the paper notebooks, run over
their checkpoints with its kernel in its own folder, and listed in the run's index."""

import json

import jupytext
import pytest
from conftest import TINY_REPRODUCE_SETTINGS, fca

from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import reproduce

pytestmark = pytest.mark.timeout(300)

# A notebook as a researcher writes it: the parameters cell the paper notebooks declare (those it needs), one
# parameter of its own, a file read beside it, one table written through NotebookRun.
OWN_NOTEBOOK = """# %% tags=["parameters"]
checkpoints = None
max_windows = 64
batch_size = None
per_layer = True
out = None
audits = None
cache = None
label = "default"

# %%
from pathlib import Path

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(
    checkpoints=checkpoints, max_windows=max_windows, batch_size=batch_size, per_layer=per_layer, out=out,
    audits=audits, cache=cache,
)
note = Path("note.txt").read_text().strip()
rows = [
    {"model": tables.model_name(a), "label": label, "note": note, "nll": a["conditions"]["correct"]["nll"]}
    for a in run.load_audits()
]
columns = [tables.Column(n, n, "text") for n in ("model", "label", "note")] + [tables.Column("nll", "NLL", "float")]
run.write_table(tables.make_table("my_nll", "my own table", columns, rows))
"""


@pytest.fixture
def own_notebook(tmp_path):
    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / "note.txt").write_text("read beside the notebook\n")
    path = folder / "my_analysis.py"
    path.write_text(OWN_NOTEBOOK)
    return path


def test_a_researchers_notebook_runs_through_fca_reproduce(own_notebook, tiny_checkpoints, tmp_path):
    checkpoint = str(tiny_checkpoints["featuregate"])
    config = tmp_path / "mine.json"
    config.write_text(
        json.dumps(
            {
                "notebooks": [str(own_notebook.relative_to(tmp_path))],  # relative to where fca runs
                "cache": str(tmp_path / "cache"),
                "processes": 1,
                "parameters": {"checkpoints": [checkpoint], **TINY_REPRODUCE_SETTINGS, "per_layer": False},
                "notebook": {"my_analysis": {"label": "from the config"}},
            }
        )
    )
    result = fca("reproduce", "--config", config, "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    assert (out / "notebooks" / "my_analysis.ipynb").is_file() and (
        out / "audits" / "featuregate" / "audit.json"
    ).is_file()
    table = (out / "tables" / "my_nll.csv").read_text()
    assert '"featuregate","from the config","read beside the notebook",' in table
    index = (out / "README.md").read_text()
    assert "| my_analysis | passed |" in index and "Table `my_nll`" in index
    ran = json.loads((out / "reproduce_config.json").read_text())["notebooks"]["my_analysis"]
    assert ran["label"] == "from the config" and ran["checkpoints"] == [checkpoint] and ran["max_windows"] == 4
    assert not (own_notebook.parent / "results").exists()  # its files went to the run's folder, not beside it


def test_an_ipynb_of_ones_own_is_planned_with_its_parameters(own_notebook, tiny_checkpoints, tmp_path):
    ipynb = own_notebook.with_suffix(".ipynb")
    jupytext.write(jupytext.read(own_notebook), ipynb)
    config = {"notebooks": [str(ipynb)], "parameters": {"checkpoints": [str(tiny_checkpoints["featuregate"])]}}
    (job,) = reproduce.plan({**config, "notebook": {"my_analysis": {"label": "x"}}}, tmp_path / "out").jobs
    assert (job.name, job.source, job.folder, job.parameters["label"]) == ("my_analysis", ipynb, ipynb.parent, "x")
    with pytest.raises(UserError, match="unknown parameter 'lable' for notebook my_analysis"):
        reproduce.plan({**config, "notebook": {"my_analysis": {"lable": "x"}}}, tmp_path / "out")
    with pytest.raises(UserError, match="two notebooks of this run are named my_analysis"):
        reproduce.plan({**config, "notebooks": [str(ipynb), str(own_notebook)]}, tmp_path / "out")
    with pytest.raises(UserError, match=r"unknown notebook '.*gone.py' \(available: .*or the path of your own"):
        reproduce.plan({**config, "notebooks": [str(tmp_path / "gone.py")]}, tmp_path / "out")
    (shipped,) = reproduce.plan({**config, "notebooks": ["explore"]}, tmp_path / "out").jobs
    assert shipped.folder is None  # a shipped notebook runs beside its executed copy
