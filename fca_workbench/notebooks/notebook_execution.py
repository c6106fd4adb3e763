"""The project's Jupyter kernel and the execution of one notebook through papermill.

A notebook's source is percent-format Python (jupytext: ``# %%`` cells), which editors, ruff and mypy read as
code; it is converted to a notebook when it runs, so no second copy can drift from it. A run's notebooks are
the shipped ones, by name, and a researcher's own, by the path of their ``.py`` or ``.ipynb``, whose kernel
starts in its own folder so its relative paths mean what they mean in JupyterLab.

Every notebook of ``fca reproduce`` runs on the kernel ``fca-workbench`` (installed by ``scripts/setup.sh``,
or here when absent), which must run this very Python; a failing notebook is reported in one line and the
files it wrote are listed for the run's index. A notebook writes its tables and figures into a folder of its
own (its ``out`` parameter: ``<out>/.notebook-files/<name>``), moved into ``<out>`` when it ends, so notebooks
running at the same time each know their own files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import move_files
from fca_workbench.results.layout import NOTEBOOKS_DIR, STAGING_DIR

if TYPE_CHECKING:
    from nbformat import NotebookNode
    from traitlets.config import Config

KERNEL_NAME = "fca-workbench"
KERNEL_DISPLAY_NAME = "Python (fca-workbench)"
SOURCE_SUFFIX = ".py"
NOTEBOOK_SUFFIX = ".ipynb"


def notebook_stem(name: str) -> str:
    """A notebook's name as a config gives it: bare, or with its source's or its notebook's suffix."""
    return str(name).removesuffix(SOURCE_SUFFIX).removesuffix(NOTEBOOK_SUFFIX)


def notebook_sources(names: list[str], notebook_dir: Path) -> dict[str, Path]:
    """Each notebook of a run by its name: a shipped one in ``notebook_dir`` by its stem, or a researcher's own
    by its path (a percent-format ``.py`` or an ``.ipynb``, relative to the current folder); one line for a name
    that is neither, or for two notebooks with one name (their executed notebooks and files would collide)."""
    shipped = sorted(p.stem for p in Path(notebook_dir).glob(f"*{SOURCE_SUFFIX}"))
    sources: dict[str, Path] = {}
    for name in names:
        given = Path(str(name))
        if notebook_stem(name) in shipped and given.parent == Path("."):
            stem, source = notebook_stem(name), Path(notebook_dir) / f"{notebook_stem(name)}{SOURCE_SUFFIX}"
        elif given.suffix in (SOURCE_SUFFIX, NOTEBOOK_SUFFIX) and given.is_file():
            stem, source = given.stem, given.resolve()
        else:
            raise UserError(
                f"unknown notebook '{name}' (available: {', '.join(shipped)}; "
                f"or the path of your own {SOURCE_SUFFIX} or {NOTEBOOK_SUFFIX} notebook)"
            )
        if stem in sources and sources[stem] != source:
            raise UserError(f"two notebooks of this run are named {stem}: {sources[stem]} and {source}")
        sources[stem] = source
    return sources


def read_notebook(source: Path) -> NotebookNode:
    """A notebook source (percent-format ``.py``, or an ``.ipynb``) as the notebook papermill executes."""
    import jupytext

    notebook = jupytext.read(source)
    # every notebook runs on the project's kernel, so it says so (a researcher's own may name none, or another)
    notebook.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY_NAME, "language": "python"}
    return notebook


def notebook_parameters(source: Path) -> dict:
    """The parameters a notebook declares (``papermill.inspect_notebook``, which reads a notebook file)."""
    import nbformat
    import papermill

    with tempfile.TemporaryDirectory(prefix="fca-notebook-") as folder:
        path = Path(folder) / f"{source.stem}{NOTEBOOK_SUFFIX}"
        nbformat.write(read_notebook(source), path)
        return cast(dict, papermill.inspect_notebook(str(path)))


@dataclass
class NotebookJob:
    name: str
    source: Path
    parameters: dict
    folder: Path | None = (
        None  # where its kernel starts: a researcher's own notebook, its folder; else beside the executed one
    )


def ensure_kernel(name: str = KERNEL_NAME) -> dict:
    """The project's Jupyter kernel must run this very Python; install it into this environment if absent."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        install(kernel_name=name, display_name=KERNEL_DISPLAY_NAME, prefix=sys.prefix)
        print(f"installed the Jupyter kernel '{name}' for {sys.executable} into {sys.prefix}", file=sys.stderr)
        spec = KernelSpecManager().get_kernel_spec(name)
    python = spec.argv[0]
    if os.path.isabs(python) and Path(python).parent.resolve() != Path(sys.executable).parent.resolve():
        raise UserError(
            f"the Jupyter kernel '{name}' runs {python}, not this environment's {sys.executable}; reinstall it "
            f"with: {sys.executable} -m ipykernel install --prefix {sys.prefix} --name {name} "
            f"(or remove the other one: jupyter kernelspec remove {name})"
        )
    return {"name": name, "python": python, "resource_dir": spec.resource_dir}


@dataclass
class NotebookResult:
    name: str
    ok: bool
    seconds: float
    output: Path
    error: str | None = None
    files: list[Path] = field(default_factory=list)


def describe_failure(exc: Exception) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        lines = [line for line in (exc.source or "").splitlines() if line.strip() and not line.startswith("#")]
        first = lines[0].strip()[:80] if lines else ""
        evalue = first_line(exc.evalue or "")
        return f"cell {exc.cell_index} (In [{exc.exec_count}]: {first}) raised {exc.ename}: {evalue}"
    return f"{type(exc).__name__}: {first_line(str(exc))}"


def local_kernel(sockets: Path) -> Config:
    """The kernel manager's settings for a kernel on this machine: IPC transport (Unix sockets in ``sockets``,
    a short private folder: socket paths are limited to about 100 bytes) instead of TCP on localhost, which
    ipykernel warns is unencrypted and which any local user could connect to."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "connection_file": str(sockets / "kernel.json")}})


def run_notebook(job: NotebookJob, out: Path) -> NotebookResult:
    """Execute one notebook into ``<out>/notebooks/<name>.ipynb``; its files (what it wrote under its ``out``)
    are moved into ``out`` whether it passed or failed."""
    import papermill

    output = out / NOTEBOOKS_DIR / f"{job.name}{NOTEBOOK_SUFFIX}"
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = out / STAGING_DIR / job.name
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted run's leftovers are not this run's files
    parameters = {**job.parameters, "out": str(staging)} if "out" in job.parameters else job.parameters
    start = time.perf_counter()
    error = None
    try:
        with tempfile.TemporaryDirectory(prefix="fca-kernel-") as sockets:
            papermill.execute_notebook(
                read_notebook(job.source),
                str(output),
                parameters=parameters,
                kernel_name=KERNEL_NAME,
                progress_bar=False,
                log_output=False,
                request_save_on_cell_execute=False,
                # the kernel starts in the notebook's folder (nbclient's resources path); papermill's own cwd=
                # would chdir this whole process, which notebooks running side by side in threads race on
                resources={"metadata": {"path": str(job.folder or output.parent)}},
                config=local_kernel(Path(sockets)),
            )
    except Exception as exc:  # a notebook's failure is reported, and the others still run
        error = describe_failure(exc)
    seconds = time.perf_counter() - start
    return NotebookResult(job.name, error is None, seconds, output, error, move_files(staging, out))
