"""``fca reproduce``: every paper notebook run through papermill into one results folder.

The notebooks in ``notebooks/`` hold presentation only. The audits they show are run once per checkpoint
and settings into ``DIR/audits/<checkpoint>/`` and shared by every notebook of the run and by later runs
(``notebook_run``: ``NotebookRun``, ``ensure_audit``). This module plans a run from its config, checks the
kernel, executes the notebooks (one at a time: ``notebook_execution``) and writes the run's index.

Everything that can be checked before a notebook starts is checked first: the config's parameter names
(against ``papermill.inspect_notebook``), the checkpoints, the data files, the output folder and the
project's Jupyter kernel (``fca-workbench``, installed by ``scripts/setup.sh``, used explicitly).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import multiprocessing
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import torch

from fca_workbench.audit.cache_lock import folder_lock
from fca_workbench.audit.run import AuditSettings
from fca_workbench.foundation import flags
from fca_workbench.foundation.checkpoint import checkpoint_key, checkpoint_name
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import (
    JSON_MAX_BYTES,
    check_writable_folder,
    read_json,
    read_text,
    reading,
    write_json,
)
from fca_workbench.foundation.flags import Shard
from fca_workbench.foundation.progress import progress as progress_bar
from fca_workbench.foundation.resources import shipped

# NotebookRun, shipped_checkpoints, DEFAULT_MAX_WINDOWS, KERNEL_NAME, ensure_audit, ensure_kernel: the notebooks,
# README and tests import them from here
from fca_workbench.notebooks.notebook_execution import (
    KERNEL_NAME as KERNEL_NAME,
)
from fca_workbench.notebooks.notebook_execution import (
    NotebookJob,
    NotebookResult,
    ensure_kernel,
    notebook_parameters,
    notebook_sources,
    notebook_stem,
    run_notebook,
)
from fca_workbench.notebooks.notebook_run import (
    DEFAULT_CACHE,
    PATH_PARAMETERS,
    RESULTS,
    NotebookRun,
    ensure_audit,
    input_bytes,
    shipped_checkpoints,
)
from fca_workbench.notebooks.notebook_run import (
    DEFAULT_MAX_WINDOWS as DEFAULT_MAX_WINDOWS,
)
from fca_workbench.notebooks.run_plan import DEFAULT_PROCESSES, PROCESSES, Plan, plan_summary, write_index
from fca_workbench.results import layout
from fca_workbench.results.design_study import read_design_study
from fca_workbench.results.outputs import is_results, mark_results, output_folder
from fca_workbench.results.shards import check_shards, shard_plan, write_shard_record
from fca_workbench.results.study_kinds import CONTROLLER_STUDY, ROUTER_STUDY

NOTEBOOK_DIR = shipped("notebooks")
PER_LAYER_NOTEBOOK = "06_per_layer"
AUDIT_NOTEBOOKS = (
    "01_variation",
    "02_assignment",
    "03_static_profiles",
    "04_execution",
    "05_muddpythia",
    PER_LAYER_NOTEBOOK,
)
# 07 reads the shipped training-dynamics logs (data/training_dynamics), 09 and 10 the design studies' summaries
# (data/controller_design, data/router_design); they audit nothing. 08 runs fca eval beside the audits (the eval extra: left out of
# the default run without lm-eval)
DOWNSTREAM_NOTEBOOK = "08_downstream"
STUDY_NOTEBOOKS = {"09_controller_design": CONTROLLER_STUDY, "10_router_design": ROUTER_STUDY}
STUDY_PARAMETER = "study"  # a study notebook's folder, checked before any notebook starts
PAPER_NOTEBOOKS = (*AUDIT_NOTEBOOKS, "07_training_dynamics", DOWNSTREAM_NOTEBOOK, *STUDY_NOTEBOOKS)
EXPLORE_NOTEBOOK = "explore"
# Parameters every audit-reading notebook declares, with their embedded defaults (None: the core's default).
AUDIT_PARAMETERS = ("eval_data", "calibration_data", "window", "max_windows", "device", "dtype", "seed", "batch_size")
# the parameters cell's audit settings as NotebookRun declares them (the paper run's defaults, audit/settings.py)
DEFAULT_PARAMETERS = {"checkpoints": None} | {
    name: getattr(NotebookRun, name) for name in (*AUDIT_PARAMETERS, "per_layer")
}
RESERVED = ("out", "audits", "cache")  # set by fca reproduce itself
CONFIG_KEYS = ("notebooks", "cache", PROCESSES, "parameters", "notebook")
# Torch threads of every audit, however many run at once: the thread count changes the order of float
# reductions (moe-s0's figures moved in the 10th digit between 1 and 2 threads), so it is the same in every
# process and the figures are bit-identical to a run of one audit at a time.
AUDIT_TORCH_THREADS = 1


def load_config(path: str | Path) -> dict:
    """A reproduce config: TOML or JSON with ``notebooks``, ``cache``, ``[parameters]`` (every notebook that
    declares a name gets it) and ``[notebook.<name>]`` (one notebook only)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    if path.suffix == ".json":
        config = read_json(path, expect=None)
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            import tomli as tomllib
        text = read_text(path, JSON_MAX_BYTES, "a TOML file")
        with reading(f"{path} is not valid TOML"):
            config = tomllib.loads(text)
    if not isinstance(config, dict):
        raise UserError(f"{path} must hold a table of settings")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise UserError(
            f"{path}: unknown config key '{unknown[0]}' (known: {', '.join(CONFIG_KEYS)}; "
            "notebook parameters go under [parameters])"
        )
    return config


def default_out() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = RESULTS / stamp, 1
    while out.exists():
        n += 1
        out = RESULTS / f"{stamp}-{n}"
    return out


def study_started(stem: str) -> bool:
    """Whether a notebook runs by default: any but a study notebook whose shipped study holds no finished run yet
    (a study is trained over several sessions; named in ``notebooks``, such a notebook is refused in one line)."""
    if stem not in STUDY_NOTEBOOKS:
        return True
    try:
        read_design_study(None, STUDY_NOTEBOOKS[stem])
    except UserError:
        return False
    return True


def plan(
    config: dict | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    config_path: str | Path | None = None,
    notebook_dir: Path = NOTEBOOK_DIR,
) -> Plan:
    """Check everything that can be checked before a notebook starts; raise a one-line ``UserError`` else."""
    config = dict(config or {})
    missing = [name for name in ("ipykernel", "papermill", "jupytext") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"fca reproduce needs the notebooks extra ({missing[0]} is missing): "
            "pip install 'fca-workbench[notebooks]' (in a checkout: scripts/setup.sh)"
        )
    has_lm_eval = importlib.util.find_spec("lm_eval") is not None
    default = [n for n in PAPER_NOTEBOOKS if (has_lm_eval or n != DOWNSTREAM_NOTEBOOK) and study_started(n)]
    names = config.get("notebooks", default)
    if isinstance(names, str) or not isinstance(names, list) or not names:
        raise UserError("config 'notebooks' must be a non-empty list of notebook names")
    if not has_lm_eval and DOWNSTREAM_NOTEBOOK in [notebook_stem(n) for n in names]:
        raise UserError(f"notebook {DOWNSTREAM_NOTEBOOK} needs the eval extra: pip install 'fca-workbench[eval]'")
    parameters = config.get("parameters")
    if isinstance(parameters, dict) and parameters.get("per_layer") is False:  # no sweep: nothing for 06 to show
        if "notebooks" in config and PER_LAYER_NOTEBOOK in [notebook_stem(n) for n in names]:
            raise UserError(
                f"notebook {PER_LAYER_NOTEBOOK} shows the per-layer sweep, which per_layer = false "
                "leaves out: drop one of the two"
            )
        names = [n for n in names if n != PER_LAYER_NOTEBOOK]
    sources = notebook_sources(names, Path(notebook_dir))
    declared = {name: notebook_parameters(path) for name, path in sources.items()}

    shared = config.get("parameters", {}) or {}
    overrides = config.get("notebook", {}) or {}
    if not isinstance(shared, dict) or not isinstance(overrides, dict):
        raise UserError("config [parameters] and [notebook.<name>] must be tables")
    for name in shared:
        if name in RESERVED:
            raise UserError(
                f"parameter '{name}' is set by fca reproduce itself (use --out, or 'cache' at the top level)"
            )
        if not any(name in d for d in declared.values()):
            known = sorted(set().union(*declared.values()) - set(RESERVED))
            raise UserError(
                f"unknown parameter '{name}': no notebook of this run declares it (known: {', '.join(known)})"
            )
    for stem, params in overrides.items():
        stem = notebook_stem(stem)
        if stem not in declared:
            raise UserError(f"[notebook.{stem}]: no such notebook in this run ({', '.join(declared)})")
        if not isinstance(params, dict):
            raise UserError(f"[notebook.{stem}] must be a table of parameters")
        for name in params:
            if name in RESERVED or name not in declared[stem]:
                raise UserError(
                    f"unknown parameter '{name}' for notebook {stem} "
                    f"(it declares: {', '.join(n for n in declared[stem] if n not in RESERVED)})"
                )

    out = output_folder(out or default_out())
    if out.is_dir() and any(out.iterdir()):
        if not is_results(out):
            raise UserError(
                f"output folder {out} is not empty and was not written by fca reproduce "
                f"(no {layout.RESULTS_MARKER} in it); choose another --out"
            )
        if not overwrite:
            raise UserError(
                f"output folder {out} already holds results; choose another --out, or pass --overwrite "
                "to write this run over them (current audits are reused)"
            )
    cache = config.get("cache") or DEFAULT_CACHE
    if not isinstance(cache, (str, Path)):
        raise UserError(f"config 'cache' must be a folder name, got {cache!r}")
    cache = check_writable_folder(Path(cache).resolve(), "config 'cache'")
    processes = config.get(PROCESSES, DEFAULT_PROCESSES)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise UserError(f"config '{PROCESSES}' must be a whole number of at least 1, got {processes!r}")

    jobs: list[NotebookJob] = []
    audits: dict[str, AuditSettings] = {}
    first_user: dict[str, str] = {}
    for stem, source in sources.items():
        params = {k: v for k, v in DEFAULT_PARAMETERS.items() if k in declared[stem]}
        params.update({k: v for k, v in shared.items() if k in declared[stem]})
        params.update({k: v for k, v in overrides.get(stem, {}).items()})
        if params.get("max_windows") == "all":  # TOML has no null: "all" means every window
            params["max_windows"] = None
        check_parameter_types(params, stem)
        for key in (*PATH_PARAMETERS, STUDY_PARAMETER):
            if params.get(key):
                params[key] = str(Path(params[key]).resolve())
        if STUDY_PARAMETER in declared[stem]:
            read_design_study(params.get(STUDY_PARAMETER), STUDY_NOTEBOOKS[stem])  # missing or empty: one line, now
        if "checkpoints" in declared[stem]:
            checkpoints = params.get("checkpoints") or shipped_checkpoints()
            if isinstance(checkpoints, str):
                checkpoints = [checkpoints]
            params["checkpoints"] = [checkpoint_key(c) for c in checkpoints]
        reserved = {"out": str(out), "audits": str(out / layout.AUDITS_DIR), "cache": str(cache)}
        params.update({k: v for k, v in reserved.items() if k in declared[stem]})
        run = NotebookRun(**{k: v for k, v in params.items() if k in NotebookRun.__dataclass_fields__})
        run.check()
        for checkpoint in run.checkpoints if "checkpoints" in declared[stem] else []:
            settings = run.settings(checkpoint)
            if checkpoint in audits and audits[checkpoint] != settings:
                raise UserError(
                    f"{checkpoint_name(checkpoint)} is audited with different settings in notebooks "
                    f"{first_user[checkpoint]} and {stem}; give both the same audit parameters"
                )
            audits.setdefault(checkpoint, settings)
            first_user.setdefault(checkpoint, stem)
        own = None if source.parent.resolve() == Path(notebook_dir).resolve() else source.parent
        jobs.append(NotebookJob(stem, source, params, own))
    ensure_kernel()
    return Plan(out, jobs, audits, cache, str(config_path) if config_path else None, overwrite, processes)


# the audit parameters a config sets, held to the types of the command lines' flags (None: the default)
PARAMETER_TYPES = {
    "seed": flags.seed,
    "window": flags.window_size,
    "max_windows": flags.positive_int,
    "batch_size": flags.positive_int,
}


def check_parameter_types(params: dict, notebook: str) -> None:
    """Refuse a parameter of notebook ``notebook`` that its flag would refuse (``seed = 1e20``, a window of
    0), and a ``per_layer`` that is no boolean (``"yes"`` is not true): one line naming it."""
    for name, parse in PARAMETER_TYPES.items():
        value = params.get(name)
        if value is None:
            continue
        try:
            if isinstance(value, bool) or not isinstance(value, int):
                raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}")
            parse(str(value))
        except argparse.ArgumentTypeError as exc:
            raise UserError(f"notebook {notebook}: parameter '{name}': {exc}") from None
    if not isinstance(params.get("per_layer", True), bool):
        raise UserError(
            f"notebook {notebook}: parameter 'per_layer' must be true or false, got {params['per_layer']!r}"
        )


def execute(plan_: Plan, progress: bool = True) -> list[NotebookResult]:
    """Run the audits once, then every notebook, ``plan_.processes`` at a time each; a failing notebook does not
    stop the others."""
    out = plan_.out
    out.mkdir(parents=True, exist_ok=True)
    mark_results(out)
    write_json(out / layout.REPRODUCE_CONFIG_FILE, plan_summary(plan_))
    started = time.perf_counter()
    run_audits(plan_.audits, out / layout.AUDITS_DIR, plan_.processes, progress)
    audit_seconds = time.perf_counter() - started
    bar = progress_bar(total=len(plan_.jobs), desc="notebooks", unit="notebook", disable=not progress)
    with ThreadPoolExecutor(plan_.processes) as pool:  # each notebook runs in its own kernel process
        running = {pool.submit(run_notebook, job, out): job for job in plan_.jobs}
        for finished in as_completed(running):
            result = finished.result()
            if not result.ok:
                bar.write(f"FAILED {result.name}: {result.error} (see {result.output})", file=sys.stderr)
            bar.update()
    bar.close()
    results = [future.result() for future in running]  # in the plan's order
    write_index(plan_, results, audit_seconds, time.perf_counter() - started)
    return results


def run_audits(audits: dict[str, AuditSettings], folder: Path, processes: int, progress: bool = True) -> None:
    """``ensure_audit`` of every checkpoint into ``folder/<checkpoint>``, ``processes`` at a time (worker
    processes), the largest checkpoint first so the last ones to finish are short; each audit with
    ``AUDIT_TORCH_THREADS`` torch threads, so the figures do not depend on ``processes``."""
    ordered = sorted(audits.items(), key=lambda item: -input_bytes(item[1]))
    bar = progress_bar(total=len(ordered), desc="audits", unit="checkpoint", disable=not progress)
    if processes == 1 or len(ordered) < 2:
        with torch_threads(AUDIT_TORCH_THREADS):
            for checkpoint, settings in ordered:
                ensure_audit(settings, folder / checkpoint_name(checkpoint))
                bar.update()
    else:
        with audit_pool(min(processes, len(ordered))) as pool:
            running = [pool.submit(ensure_audit, s, folder / checkpoint_name(c)) for c, s in ordered]
            for finished in as_completed(running):
                finished.result()  # a failed audit stops the run, as it does one audit at a time
                bar.update()
    bar.close()


def audit_pool(processes: int) -> ProcessPoolExecutor:
    """``processes`` fresh interpreters (spawned: no forked torch thread pools), each with
    ``AUDIT_TORCH_THREADS`` torch threads."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(processes, context, initializer=torch.set_num_threads, initargs=(AUDIT_TORCH_THREADS,))


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """This process's torch threads set to ``count`` for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reproduce(
    config_path: str | Path | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
    assemble: bool = False,
) -> tuple[Plan, list[NotebookResult]]:
    """``fca reproduce``: plan the run from its config (everything checked first), then execute it. With
    ``assemble``, ``out`` holds the audits of every ``--shard K/N`` of this config (``reproduce_shard``),
    checked against this plan before the notebooks run on them."""
    config = load_config(config_path) if config_path else {}
    plan_ = plan(config, split_out(out, assemble), overwrite or assemble, config_path)
    if assemble:
        check_shards(plan_.out, shard_work(plan_))
    with folder_lock(
        plan_.out, "results folder", holder="fca reproduce", hint="let it finish, or choose another --out"
    ):
        return plan_, execute(plan_, progress)


def reproduce_shard(
    config_path: str | Path | None, out: str | Path | None, shard: Shard, progress: bool = True
) -> Path:
    """``fca reproduce --shard K/N``: this shard's audits of the plan into ``out`` (shared by every shard, or
    gathered into one folder afterwards), then its record; ``reproduce(..., assemble=True)`` runs the
    notebooks once every shard has finished. Returns the record's path."""
    config = load_config(config_path) if config_path else {}
    plan_ = plan(config, split_out(out, True), True, config_path)
    plan_.out.mkdir(parents=True, exist_ok=True)
    mark_results(plan_.out)
    mine = dict(shard.take(plan_.audits.items()))
    run_audits(mine, plan_.out / layout.AUDITS_DIR, plan_.processes, progress)
    return write_shard_record(plan_.out, shard, shard_work(plan_))


def split_out(out: str | Path | None, split: bool) -> str | Path | None:
    """A split run's folder: named, as every shard and the assembly must name the same one."""
    if split and out is None:
        raise UserError("--shard and --assemble need --out: the folder every shard of the run writes into")
    return out


def shard_work(plan_: Plan) -> dict:
    """The plan every shard of one ``fca reproduce`` agrees on (``results.shards``): its audits, in order."""
    audits = ((checkpoint_name(c), s.without_paths()) for c, s in plan_.audits.items())
    return shard_plan("fca reproduce", audits)
