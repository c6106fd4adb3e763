"""``fca eval``: lm-eval tasks under FCA conditions, their accuracy, each condition's gap against ``correct``
(paired, clustered by play: ``gaps``) and a static profile's retention, as ``downstream.json``.

The static profiles come from the calibration set exactly as ``fca audit`` makes them: a replay session on
the same settings, its calibration capture in a temporary folder, so an audit's own cache in the output folder
is never touched. Tasks run through lm-eval's evaluator with its
own task definitions, metrics and standard errors; the shipped ``data/tasks/`` ones run offline.
"""

import importlib.metadata
import logging
import math
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import datasets
import lm_eval
import lm_eval.evaluator
import numpy
import torch
from lm_eval.tasks import TaskManager

from fca_workbench.audit.cache_lock import folder_lock
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.run import AUDIT_COMMAND, check_audit_out
from fca_workbench.audit.session import ReplaySession
from fca_workbench.data.tasks import TASKS_DIR
from fca_workbench.downstream.eval_settings import EvalSettings
from fca_workbench.downstream.frozen import ConditionLogits, eval_conditions
from fca_workbench.downstream.gaps import gap, retention
from fca_workbench.downstream.lm import WorkbenchLM
from fca_workbench.foundation.checkpoint import Checkpoint, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import reading, write_json
from fca_workbench.results.binding import check_folder_binding
from fca_workbench.results.conditions import LOW, REFERENCE, condition_named
from fca_workbench.results.frames import DOWNSTREAM_SCHEMA, OLDER_DOWNSTREAM_SCHEMAS, check_downstream
from fca_workbench.results.layout import DOWNSTREAM_FILE, cache_root
from fca_workbench.results.outputs import mark_output, refuse_foreign

CLUSTER_FIELDS = ("play",)  # a document field naming the source it shares with others (the shipped tasks' play)
BOOTSTRAP_ITERS = 1000  # lm-eval's resamples for the stderr of a metric that is not a mean (a mean's is exact)


def local_tasks() -> dict[str, Path]:
    """The shipped tasks: every ``data/tasks/<name>.yaml``, by name."""
    return {path.stem: path for path in sorted(TASKS_DIR.glob("*.yaml"))}


def resolve_tasks(names: list[str]) -> tuple[TaskManager, list[str]]:
    """lm-eval's task manager, the shipped tasks' folder included (as ``lm_eval --include_path`` includes it:
    their YAML reads their data from beside it), and the names to load (lm-eval's whole index is read only
    when some task is not a shipped one); an unknown name is one line, before any model is loaded."""
    shipped = local_tasks()
    others = [name for name in names if name not in shipped]
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=bool(others))
    unknown = [name for name in others if name not in manager.all_tasks]
    if unknown:
        raise UserError(
            f"--tasks: unknown task {', '.join(map(repr, unknown))}; shipped: {', '.join(shipped)}, "
            "or any task lm-eval lists (lm-eval ls tasks)"
        )
    return manager, names


def run_eval(settings: EvalSettings, out: str | Path, ranks: Ranks = SINGLE) -> dict | None:
    """Evaluate every task under every condition and write ``downstream.json`` into ``out`` (an audit folder,
    or a new one): per task and condition, each metric lm-eval reports with its stderr, its gap against ``correct``
    paired over the same documents with a standard error clustered by play, and a static profile's retention
    against its reference with both ends and an interval (``task_figures``); returns it.

    ``ranks`` (``distributed.process_group``, under torchrun): lm-eval shares each task's documents among the
    ranks (``WorkbenchLM``'s rank and world size, as under accelerate) and gathers them on rank 0, which writes
    the file and returns it (the other ranks return None). Every rank estimates the static profiles from the
    whole calibration set itself (the same windows and model on every rank, checked), so each answers its
    documents with the profiles one process would use."""
    out = check_audit_out(out)
    refuse_foreign(out / DOWNSTREAM_FILE, DOWNSTREAM_SCHEMA, older=OLDER_DOWNSTREAM_SCHEMAS)
    manager, tasks = resolve_tasks(settings.tasks)
    loaded = load_tasks(manager, tasks, settings.audit.seed)  # a task whose data is not on disk: one line, first
    checkpoint = resolve_checkpoint(settings.audit.checkpoint, settings.audit.trust_remote_code)
    with tempfile.TemporaryDirectory(prefix="fca-eval-") as cache:
        audit = replace(settings.audit, cache=cache)
        session = ReplaySession.open(  # the fingerprint remembered beside the audit's own caches
            audit, out, checkpoint=checkpoint, read_now=(CALIBRATION,), memo_root=cache_root(settings.audit.cache, out)
        )
        check_folder_binding(out, session.fingerprint)  # another model's audit folder: refused before any work
        conditions = eval_conditions(settings.conditions, session)
        ranks.agree(
            lambda: {"model": session.fingerprint, "calibration": session.data_summary(CALIBRATION)["fingerprint"]}
        )
        with folder_lock(out, "output folder", ranks=ranks):
            if ranks.lead:
                mark_output(out, AUDIT_COMMAND)
            downstream = evaluate_conditions(session, checkpoint, conditions, loaded, settings, ranks)
            if downstream is None:
                return None
            check_downstream(downstream, out / DOWNSTREAM_FILE)
            write_json(out / DOWNSTREAM_FILE, downstream)
    return downstream


def evaluate_conditions(
    session: ReplaySession,
    checkpoint: Checkpoint,
    conditions: list[str],
    loaded: dict,
    settings: EvalSettings,
    ranks: Ranks = SINGLE,
) -> dict | None:
    """``downstream.json``: every loaded task under every condition, through lm-eval's evaluator (on rank 0; None
    on the others); its model recorded as ``audit.json`` records it (``Checkpoint.record``: with the hub id and
    commit of a hub name)."""
    model, calib_windows = session.model, session.windows(CALIBRATION)
    if session.has_controller:
        session.profiles  # noqa: B018 (the calibration capture, before the first task)
    lm = WorkbenchLM(model, session.tokenizer, calib_windows.shape[1], session.batch_size, ranks)
    by_condition = {}
    for condition in conditions:
        lm.use(ConditionLogits(session, condition))
        by_condition[condition] = evaluate(lm, loaded, settings)
    if not ranks.lead:
        return None
    return {
        "schema": DOWNSTREAM_SCHEMA,
        "model": {
            **checkpoint.record(),
            "arch": model.arch,
            "fingerprint": session.fingerprint,
        },
        "settings": {
            "tasks": settings.tasks,
            "conditions": conditions,
            "limit": settings.limit,
            "seed": settings.audit.seed,
            "dtype": settings.audit.dtype,
            "device": settings.audit.device,
            "window": calib_windows.shape[1],
            "batch_size": session.batch_size,
            "lm_eval": importlib.metadata.version("lm-eval"),
        },
        "calibration": session.data_summary(CALIBRATION),
        "tasks": task_figures(by_condition),
    }


def load_tasks(manager: TaskManager, tasks: list[str], seed: int) -> dict:
    """lm-eval's tasks, loaded once for every condition, set up as ``simple_evaluate`` sets them up: zero-shot
    unless the task says otherwise, its few-shot sampler seeded (lm-eval's warnings, e.g. that a custom
    dataset takes ``--metadata``, and datasets' "Generating split" bar on a fresh cache, kept off the user's
    screen: a refusal after the tasks load stays one line)."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    with reading(
        "lm-eval cannot load the tasks",
        "a task's data must be in the Hugging Face cache: fca eval runs offline unless HF_DATASETS_OFFLINE=0",
    ):
        loaded = manager.load(tasks)
    for task in loaded["tasks"].values():
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    return loaded


def evaluate(lm: WorkbenchLM, loaded: dict, settings: EvalSettings) -> dict:
    """lm-eval's results of every task (and group) under the condition ``lm`` uses: per task, its documents
    evaluated (``samples``), its metrics (``metrics``: value and stderr), each document's value (``documents``) and
    its cluster (``clusters``: the play it comes from, ``clusters_of``). ``evaluator.evaluate`` is
    ``simple_evaluate`` without its model loading and its environment report (a ``pip list`` per call)."""
    random.seed(settings.audit.seed)
    numpy.random.seed(settings.audit.seed)
    torch.manual_seed(settings.audit.seed)
    results = lm_eval.evaluator.evaluate(
        lm=lm, task_dict=loaded, limit=settings.limit, bootstrap_iters=BOOTSTRAP_ITERS, log_samples=True
    )
    if results is None:  # a rank other than 0: its documents went to rank 0
        return {}
    samples, logged = results.get("n-samples", {}), results.get("samples") or {}
    return {
        task: {
            "samples": samples.get(task, {}).get("effective"),
            "metrics": metrics_of(entry),
            "documents": per_document(logged.get(task, [])),
            "clusters": clusters_of(logged.get(task, [])),
        }
        for task, entry in results["results"].items()
    }


def per_document(logged: list[dict]) -> dict[str, dict]:
    """Per metric (named as ``metrics_of`` names it), each document's value (None where it is not a number):
    the same documents under two conditions give the gap between them a paired standard error."""
    values: dict[str, dict] = {}
    for sample in logged:
        kept = sample["filter"]
        for metric in sample["metrics"]:
            name = metric if kept == "none" else f"{metric},{kept}"
            values.setdefault(name, {})[sample["doc_id"]] = finite(sample.get(metric))
    return values


def clusters_of(logged: list[dict]) -> tuple[str | None, dict]:
    """The field the documents name their source by (the first of ``CLUSTER_FIELDS`` every document has) and each
    document's cluster; ``(None, each document its own)`` where they name none."""
    docs = {sample["doc_id"]: sample.get("doc") or {} for sample in logged}
    for field in CLUSTER_FIELDS:
        if docs and all(isinstance(doc, dict) and field in doc for doc in docs.values()):
            return field, {d: (field, str(doc[field])) for d, doc in docs.items()}
    return None, {d: ("document", d) for d in docs}


def metrics_of(entry: dict) -> dict[str, dict]:
    """A task's numeric metrics from lm-eval's ``"<metric>,<filter>"`` keys (named by the metric alone for the
    ``none`` filter), each with its ``"<metric>_stderr,<filter>"`` (None where lm-eval gives none)."""
    metrics = {}
    for key, value in entry.items():
        metric, comma, kept = key.partition(",")
        if not comma or metric.endswith("_stderr") or finite(value) is None:
            continue
        name = metric if kept == "none" else key
        metrics[name] = {"value": finite(value), "stderr": finite(entry.get(f"{metric}_stderr,{kept}"))}
    return metrics


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number, else None (lm-eval writes ``"N/A"`` for no stderr)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def task_figures(by_condition: dict[str, dict]) -> dict[str, dict]:
    """Per task: ``samples``, its ``clusters`` (the document field they come from and their number) and, per
    condition and metric, lm-eval's value and stderr, the ``gap`` against ``correct`` (paired, clustered; None for
    ``correct``) and the ``retention`` of a condition that reports one (``gaps.retention``, against the condition's
    own reference where it was evaluated, else ``global_mean``, which then stays beside it under
    ``other_references``; None where the model has no controller and evaluates ``correct`` alone)."""
    figures = {}
    for task, entry in by_condition[REFERENCE].items():
        field, clusters = entry["clusters"]
        rows = {
            condition: {
                m: {**f, "documents": results[task]["documents"].get(m)} for m, f in results[task]["metrics"].items()
            }
            for condition, results in by_condition.items()
        }
        conditions = {
            condition: {metric: condition_figure(condition, metric, rows, clusters) for metric in metrics}
            for condition, metrics in rows.items()
        }
        count = len(set(clusters.values()))
        figures[task] = {
            "samples": entry["samples"],
            "clusters": {"field": field, "count": count},
            "conditions": conditions,
        }
    return figures


def condition_figure(condition: str, metric: str, rows: dict[str, dict], clusters: dict) -> dict:
    """One condition's figure of one metric (``task_figures``)."""
    f, top = rows[condition][metric], rows[REFERENCE].get(metric)
    figure = {"value": f["value"], "stderr": f["stderr"], "gap": None, "retention": None}
    if top is None or condition == REFERENCE:
        return figure
    figure["gap"] = gap(top, f, clusters)
    named = condition_named(condition)
    ends = [end for end in (named.reference, LOW) if end is not None and metric in rows.get(end, {})]
    if named.retention and ends:
        kept = retention(f, top, rows[ends[0]][metric], ends[0], clusters)
        if ends[0] != LOW and len(ends) > 1:
            kept["other_references"] = {LOW: retention(f, top, rows[LOW][metric], LOW, clusters)}
        figure["retention"] = kept
    return figure
