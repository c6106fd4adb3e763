"""``fca reproduce``: clear errors before any notebook starts, no silent clobbering, a failing notebook named
with its cell while the others still run, and audits / coefficient caches reused across notebooks and runs."""

import gzip
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import torch
from conftest import TINY_REPRODUCE_SETTINGS, assert_one_line_error, fca

from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import reproduce
from fca_workbench.notebooks.notebook_execution import NotebookJob, run_notebook
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.outputs import mark_results

pytestmark = pytest.mark.timeout(300)  # `fca reproduce` in subprocesses: a hang fails after 5 min


def write_config(path, **config):
    path.write_text(json.dumps(config))
    return path


def test_unknown_parameter_is_refused_before_anything_runs(tmp_path):
    config = write_config(tmp_path / "c.json", parameters={"max_windos": 4})
    result = fca("reproduce", "--config", config, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, "unknown parameter 'max_windos'", "max_windows")  # says what is known
    assert not (tmp_path / "out").exists()


def test_unknown_parameter_for_one_notebook(tmp_path):
    config = {"notebooks": ["05_muddpythia", "explore"], "notebook": {"05_muddpythia": {"layer": 1}}}
    with pytest.raises(UserError, match="unknown parameter 'layer' for notebook 05_muddpythia"):
        reproduce.plan(config, tmp_path / "out")
    with pytest.raises(UserError, match="unknown notebook 'nope'"):
        reproduce.plan({"notebooks": ["nope"]}, tmp_path / "out")
    with pytest.raises(UserError, match="set by fca reproduce"):
        reproduce.plan({"parameters": {"out": "x"}}, tmp_path / "out")
    for processes in (0, "2", True):
        with pytest.raises(
            UserError, match=f"config 'processes' must be a whole number of at least 1, got {processes!r}"
        ):
            reproduce.plan({"notebooks": ["05_muddpythia"], "processes": processes}, tmp_path / "out")
    assert reproduce.plan({"notebooks": ["05_muddpythia"], "processes": 1}, tmp_path / "out").processes == 1
    with pytest.raises(UserError, match="unknown config key 'max_windows'"):
        reproduce.load_config(write_config(tmp_path / "c.json", max_windows=4))
    assert not (tmp_path / "out").exists()


def test_missing_checkpoint_is_refused_before_anything_runs(tiny_checkpoints, tmp_path):
    config = {"parameters": {"checkpoints": [str(tiny_checkpoints["featuregate"]), str(tmp_path / "gone")]}}
    with pytest.raises(UserError, match="checkpoint folder not found: .*gone"):
        reproduce.plan(config, tmp_path / "out")
    with pytest.raises(UserError, match="text file not found"):
        reproduce.plan(
            {"parameters": {"checkpoints": [str(tiny_checkpoints["dense"])], "eval_data": str(tmp_path / "none.txt")}},
            tmp_path / "out",
        )
    assert not (tmp_path / "out").exists()


def test_existing_results_are_not_clobbered(tiny_checkpoints, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mark_results(out)  # the marker an earlier fca reproduce run left
    (out / "README.md").write_text("an earlier run")
    config = {
        "notebooks": ["03_static_profiles"],
        "parameters": {"checkpoints": [str(tiny_checkpoints["featuregate"])]},
    }
    with pytest.raises(UserError, match="already holds results.*--overwrite"):
        reproduce.plan(config, out)
    assert (out / "README.md").read_text() == "an earlier run"
    assert reproduce.plan(config, out, overwrite=True).out == out.resolve()  # only when asked
    empty = tmp_path / "empty"
    empty.mkdir()
    assert reproduce.plan(config, empty).out == empty.resolve()  # an empty folder holds nothing to clobber


def test_default_config_is_the_shipped_checkpoints_on_cpu(tmp_path):
    jobs = {}
    assert reproduce.PAPER_NOTEBOOKS == (
        *reproduce.AUDIT_NOTEBOOKS,
        "07_training_dynamics",
        "08_downstream",
        "09_controller_design",
        "10_router_design",
    )
    for stem in reproduce.AUDIT_NOTEBOOKS:
        declared = reproduce.notebook_parameters(reproduce.NOTEBOOK_DIR / f"{stem}.py")
        jobs[stem] = declared
        assert set(reproduce.DEFAULT_PARAMETERS) | set(reproduce.RESERVED) <= set(declared)
        assert declared["max_windows"]["default"] == str(reproduce.DEFAULT_MAX_WINDOWS)
    assert [p.split("/")[-1] for p in reproduce.shipped_checkpoints()] == [
        *(f"featuregate-s{s}" for s in range(7)),
        "dense-s0",
        "muddpythia-s0",
        "moe-s0",
        "ssm-s0",
    ]
    assert reproduce.DEFAULT_PARAMETERS["device"] == "cpu"


def test_kernel_is_the_projects_own_python():
    kernel = reproduce.ensure_kernel()
    assert kernel["name"] == "fca-workbench"
    assert Path(kernel["python"]).parent.resolve() == Path(sys.executable).parent.resolve()  # this venv's bin/


@pytest.mark.timeout(1200)  # may be the first to need the shared run (conftest.py)
def test_audits_and_caches_are_reused_across_notebooks_and_runs(tiny_reproduce, tmp_path):
    """The shared run's audit (copied: tests never write into that run) is read back, not rerun, by a notebook's
    ``NotebookRun`` with the same settings; a later run into another folder reuses the coefficient cache; other
    settings run the audit again."""
    plan, _, audits, folders = tiny_reproduce
    run1 = Path(shutil.copytree(plan.out / "audits", tmp_path / "run1"))
    settings = dict(
        checkpoints=[str(folders["featuregate-s0"])], cache=str(plan.cache), progress=False, **TINY_REPRODUCE_SETTINGS
    )
    audit_json = run1 / "featuregate-s0" / "audit.json"
    shards = sorted(plan.cache.rglob("*.safetensors"))
    assert shards
    stamps = {p: p.stat().st_mtime_ns for p in [audit_json, *shards]}

    notebook = reproduce.NotebookRun(audits=str(run1), **settings)  # another notebook, after the run's own
    audit = notebook.load_audits()[0]
    assert notebook.audit_dir(audit) / "audit.json" == audit_json
    assert audit == audits["featuregate-s0"] and audit_json.stat().st_mtime_ns == stamps[audit_json]

    other = reproduce.NotebookRun(audits=str(tmp_path / "run2"), **settings).load_audits()[0]  # a later run
    assert other["conditions"] == audit["conditions"]
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards)  # the coefficient cache was reused

    changed = reproduce.NotebookRun(audits=str(run1), **{**settings, "seed": 1}).load_audits()[0]
    assert changed["settings"]["seed"] == 1 and audit_json.stat().st_mtime_ns != stamps[audit_json]


@pytest.mark.timeout(1200)  # papermill in a subprocess, and maybe the shared run: a hung kernel fails here
def test_failing_notebook_is_named_with_its_cell_and_the_others_still_run(tiny_reproduce, tmp_path):
    """No MUDDPythia among the checkpoints: its notebook fails, the one after it still runs, exit code 1. (The
    shared run's checkpoint and coefficient cache, so no capture runs again.)"""
    plan, _, _, folders = tiny_reproduce
    config = write_config(
        tmp_path / "c.json",
        notebooks=["05_muddpythia", "03_static_profiles"],
        cache=str(plan.cache),
        parameters={"checkpoints": [str(folders["featuregate-s0"])], **TINY_REPRODUCE_SETTINGS},
    )
    out = tmp_path / "out"
    result = fca("reproduce", "--config", config, "--out", out)
    assert result.returncode == 1, result.stderr
    assert "FAILED 05_muddpythia: cell" in result.stderr
    assert "raised ValueError: no MUDDPythia checkpoint" in result.stderr
    assert "passed  03_static_profiles" in result.stdout
    assert (out / "tables" / "retention_over_seeds.csv").is_file()
    assert (out / "notebooks" / "05_muddpythia.ipynb").is_file()  # kept, with the error in it
    assert (out / ".fca-results").is_file()  # the marker that lets a later --overwrite write here
    index = (out / "README.md").read_text()
    assert "1 of 2 notebooks passed" in index and "**FAILED**: cell" in index


def test_per_layer_false_leaves_the_per_layer_notebook_out(tiny_checkpoints, tmp_path):
    """Without the sweep, notebook 06 has nothing to show: the default list drops it (it used to fail the run),
    and asking for both is refused before anything runs."""
    parameters = {"checkpoints": [str(tiny_checkpoints["featuregate"])], "per_layer": False}
    jobs = [job.name for job in reproduce.plan({"parameters": parameters}, tmp_path / "a").jobs]
    assert jobs == [n for n in reproduce.PAPER_NOTEBOOKS if n != reproduce.PER_LAYER_NOTEBOOK]
    assert all(
        not audit.per_layer for audit in reproduce.plan({"parameters": parameters}, tmp_path / "a").audits.values()
    )
    with_sweep = [
        job.name for job in reproduce.plan({"parameters": {**parameters, "per_layer": True}}, tmp_path / "b").jobs
    ]
    assert with_sweep == list(reproduce.PAPER_NOTEBOOKS)
    with pytest.raises(UserError, match="06_per_layer shows the per-layer sweep"):
        reproduce.plan({"notebooks": ["06_per_layer"], "parameters": parameters}, tmp_path / "c")
    assert not any((tmp_path / name).exists() for name in "abc")


def test_the_names_notebooks_and_readme_import_stay_in_reproduce():
    """``reproduce`` was split (notebook_run, notebook_execution); what the notebooks, README and tests import
    from it is still there, and is the one object, not a copy."""
    from fca_workbench.notebooks import notebook_execution, notebook_run

    for name in ("NotebookRun", "shipped_checkpoints", "DEFAULT_MAX_WINDOWS", "ensure_audit"):
        assert getattr(reproduce, name) is getattr(notebook_run, name)
    for name in ("KERNEL_NAME", "ensure_kernel"):
        assert getattr(reproduce, name) is getattr(notebook_execution, name)
    assert reproduce.NOTEBOOK_DIR.name == "notebooks" and reproduce.KERNEL_NAME == "fca-workbench"


def test_without_the_notebooks_extra_one_line_names_what_is_missing(monkeypatch, tmp_path):
    real = reproduce.importlib.util.find_spec
    monkeypatch.setattr(
        reproduce.importlib.util, "find_spec", lambda name, *args: None if name == "papermill" else real(name, *args)
    )
    with pytest.raises(UserError, match=r"needs the notebooks extra \(papermill is missing\)"):
        reproduce.plan(out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_notebook_runs_on_a_local_kernel_over_ipc_without_the_tcp_warning(tmp_path, capfd):
    """``fca reproduce``'s kernel listens on Unix sockets, not TCP: ipykernel's "Kernel is running over TCP without
    encryption" warning (which the kernel writes to the inherited standard error) is never printed."""
    import nbformat

    from fca_workbench.notebooks.notebook_execution import NotebookJob, ensure_kernel, run_notebook

    ensure_kernel()
    source = tmp_path / "transport.ipynb"
    cell = "from ipykernel.kernelapp import IPKernelApp\nprint(IPKernelApp.instance().transport)"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), source)
    result = run_notebook(NotebookJob("transport", source, {}), tmp_path / "out")
    assert result.ok, result.error
    (executed,) = nbformat.read(result.output, as_version=4).cells
    assert executed.outputs[0]["text"].strip() == "ipc"
    captured = capfd.readouterr()
    assert "without encryption" not in captured.err + captured.out
    assert "eavesdropping" not in captured.err + captured.out
    assert not list((tmp_path / "out").rglob("*ipc*"))  # the sockets lived in a private temporary folder


def test_audits_in_two_processes_are_bit_identical_to_one_at_a_time(tiny_checkpoints, tiny_mixtral, tmp_path):
    """Every figure and per-token NLL of two audits run at once equals, bit for bit, the same audits run one at
    a time (each process has the same torch thread count: a different one moved moe-s0's figures)."""
    checkpoints = [str(tiny_checkpoints["featuregate"]), str(tiny_mixtral)]
    runs = {}
    for processes in (1, 2):
        run = NotebookRun(
            checkpoints=checkpoints,
            out=tmp_path / f"out{processes}",
            cache=tmp_path / f"cache{processes}",
            **TINY_REPRODUCE_SETTINGS,
        )
        reproduce.run_audits({c: run.settings(c) for c in run.checkpoints}, run.audits, processes, progress=False)
        runs[processes] = {name: audit_figures(run.audits / name) for name in ("featuregate", "mixtral")}
    assert runs[2] == runs[1]
    assert runs[1]["mixtral"]["per_layer"] and runs[1]["featuregate"]["conditions"]["cross_input"]["delta"] != 0


def test_every_audit_process_has_the_same_torch_threads():
    """The thread count that keeps the figures bit-identical (at the tiny test shapes it changes nothing, so it is
    checked itself): in every worker process, and in this process while it audits."""
    with reproduce.audit_pool(2) as pool:
        assert {pool.submit(torch.get_num_threads).result() for _ in range(4)} == {reproduce.AUDIT_TORCH_THREADS}
    before = torch.get_num_threads()
    with reproduce.torch_threads(reproduce.AUDIT_TORCH_THREADS):
        assert torch.get_num_threads() == reproduce.AUDIT_TORCH_THREADS
    assert torch.get_num_threads() == before


def audit_figures(folder):
    """An audit's figures and per-token NLLs, without its paths and wall-clock latencies."""
    audit = json.loads((folder / "audit.json").read_text())
    execution = without_latency(audit["execution"])
    keep = ("conditions", "retention", "variance", "variation", "per_layer", "replay_check")
    with gzip.open(folder / "per_token_nll.csv.gz", "rt") as handle:
        per_token = handle.read()
    return {**{k: audit[k] for k in keep}, "execution": execution, "per_token": per_token}


def without_latency(figures):
    return {k: without_latency(v) if isinstance(v, dict) else v for k, v in figures.items() if "latency" not in k}


def test_notebooks_run_side_by_side_in_their_own_folder_and_leave_this_process_where_it_was(tmp_path, monkeypatch):
    """Two notebooks at once, in threads as ``fca reproduce`` runs them: each kernel works in its notebook's
    folder, and nothing changes this process's working folder (a chdir per notebook would race)."""
    source = tmp_path / "where.ipynb"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("out = None", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import os, pathlib\npathlib.Path(out).mkdir(parents=True)\npathlib.Path(out, 'cwd.txt').write_text(os.getcwd())"
        ),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, source)
    here, chdir = Path.cwd(), os.chdir

    def stay(path):  # papermill's file reader "changes" to the folder it started in: the only chdir allowed
        if Path(path) != here:
            pytest.fail(f"chdir({path}) in the process running notebooks")
        chdir(path)

    monkeypatch.setattr(os, "chdir", stay)
    jobs = [NotebookJob(name, source, {"out": "unset"}) for name in ("first", "second")]
    outs = [tmp_path / "a", tmp_path / "b"]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run_notebook, jobs, outs))
    assert [r.error for r in results] == [None, None]
    for out in outs:
        assert (out / "cwd.txt").read_text() == str(out / "notebooks")


def test_config_values_are_held_to_the_flags_types(tmp_path):
    """What ``fca audit``'s flags refuse, a config's parameters refuse too, in one line naming them; a cache
    folder nobody can write in is refused before any audit."""
    notebooks = {"notebooks": ["05_muddpythia"]}
    for parameters, message in [
        ({"seed": 1e20}, "parameter 'seed': expected a whole number, got 1e+20"),
        ({"seed": 2**40}, "parameter 'seed': must be at most"),
        ({"window": 1}, "parameter 'window': must be at least 2"),
        ({"max_windows": 2.5}, "parameter 'max_windows': expected a whole number"),
        ({"batch_size": True}, "parameter 'batch_size': expected a whole number, got True"),
        ({"per_layer": "yes"}, "parameter 'per_layer' must be true or false, got 'yes'"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)) as error:
            reproduce.plan({**notebooks, "parameters": parameters}, tmp_path / "out")
        assert "\n" not in str(error.value)
    for cache, message in [("/proc/self", "is no folder one can write in"), (3, "got 3")]:
        with pytest.raises(UserError, match=re.escape(message)):
            reproduce.plan({**notebooks, "cache": cache}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_toml_config_is_read_with_the_json_cap(tmp_path, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text('notebooks = ["05_muddpythia"]\n' + "# padding\n" * 20)
    assert reproduce.load_config(config) == {"notebooks": ["05_muddpythia"]}
    monkeypatch.setattr(reproduce, "JSON_MAX_BYTES", 100)
    with pytest.raises(UserError, match="is larger than 100 bytes; refusing to read it as a TOML file"):
        reproduce.load_config(config)
