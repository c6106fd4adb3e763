"""``fca audit``: capture, replay under every condition, figures, execution: one ``audit.json``.

This is orchestration only; every number comes from capture, replay, metrics and execution. Under torchrun
the same line runs on every rank, each on its share of the shards (``distributed.py``); rank 0 writes.
"""

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.controlled import controlled_model
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.assignment import Profiles
from fca_workbench.audit.cache_lock import cache_lock, folder_lock
from fca_workbench.audit.capture import shard_count
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.execution import execution_audit, expert_execution
from fca_workbench.audit.inputs import CALIBRATION, DTYPES, EVAL
from fca_workbench.audit.metrics import bootstrap_counts
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.audit.sweep import per_layer_rows, sweep_mode
from fca_workbench.data.windows import window_sampling
from fca_workbench.foundation.checkpoint import checkpoint_name, configuration, folder_configuration, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import check_folder_path, write_atomic, write_json
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.foundation.progress import progress
from fca_workbench.results.binding import audit_binding
from fca_workbench.results.layout import AUDIT_FILE, PROFILES_FILE, cache_root, split_cache
from fca_workbench.results.outputs import check_output, mark_output, output_folder, refuse_foreign
from fca_workbench.results.per_token import per_token_files
from fca_workbench.results.profiles import save_profiles
from fca_workbench.results.schema import AUDIT_SCHEMA, validate_audit
from fca_workbench.results.verdicts import verdicts

AUDIT_COMMAND = "fca audit"  # what an audit folder's marker names
IN_MEMORY = "memory:"  # model.path of an audit of a model held in memory: its name follows, no folder


EXECUTION_BATCHES = 4  # execution is counted on the first batches: a full extra pass would add nothing


def default_out(checkpoint: str | Path) -> Path:
    return Path("results") / f"audit-{checkpoint_name(checkpoint)}"


def check_audit_out(out: str | Path) -> Path:
    """The audit's output folder, refused before any work when it is a file, holds an ``audit.json`` this
    workbench did not write (anything that is not a valid ``fca-audit/1`` audit), or holds files without the
    marker of an audit folder (``check_output``; a valid ``audit.json`` of an earlier version adopts it)."""
    out = output_folder(out)
    refuse_foreign(out / AUDIT_FILE, AUDIT_SCHEMA, validate_audit)
    return check_output(out, AUDIT_COMMAND, adopt=lambda folder: (folder / AUDIT_FILE).is_file())


def run_audit(
    settings: AuditSettings,
    out: str | Path,
    ranks: Ranks = SINGLE,
    lock_wait: float = 0.0,
    capture_only: bool = False,
) -> dict | None:
    """Run the full audit and write ``audit.json``, ``per_token_nll.csv.gz`` and the static profiles.

    The line, step by step, each asked of one replay session (``session.ReplaySession``): capture the eval and
    calibration coefficients and the calibration set's static profiles (``capture_all``); frozen replay of every
    eval window under every condition (``replay``); from the per-window NLLs, every condition's NLL and ΔNLL and
    the profiles' gap retention (``figures``); the variance decomposition and variation of the eval coefficients
    (``spread``); execution counted on the first batches and timed (``execution_figures``,
    ``execution.expert_execution``). The mini-audit (``mini.py``) asks a session the same on fewer windows.

    With ``settings.per_layer``, every condition is also replayed at each decoder layer alone, and at each
    controller alone where a layer holds several (``sweep.py``).
    ``ranks`` (``distributed.process_group``, under torchrun): each rank captures and replays its share of the
    shards; rank 0 gathers per-window results, computes the figures, writes the outputs and returns the audit
    (the other ranks return None). Another audit holding the cache folder is waited for ``lock_wait`` seconds.
    ``capture_only`` stops after the capture and returns None: the caches are complete, so a later audit with
    the same settings (on another node, given a copy of the cache) goes straight to replay.
    """
    out = checked_out(settings, out)
    checkpoint = resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)  # once: its commit recorded
    session = ReplaySession.open(settings, out, ranks, checkpoint)
    source = {**checkpoint.record(), "configuration": folder_configuration(checkpoint.folder)}
    return audit_session(session, out, source, lock_wait, capture_only)


def audit_model(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    out: str | Path,
    name: str | None = None,
    lock_wait: float = 0.0,
    **settings: Any,
) -> dict:
    """``run_audit`` of a model held in memory (a transformers causal LM or a workbench model, as
    ``controlled_model`` takes it) with its tokenizer: the same session, files and figures as an audit of its
    folder. ``name`` is what ``audit.json`` calls it (default: the config's ``_name_or_path``, else its model
    type); ``settings``: any ``AuditSettings`` field but the checkpoint (``max_windows=16``, ``per_layer=True``,
    ...), the device and dtype being the model's own. The caches bind to its weights' fingerprint, as ever."""
    parameter = next(model.parameters())
    dtype = next((n for n, d in DTYPES.items() if d == parameter.dtype), None)
    if dtype is None:
        raise UserError(f"a model in {parameter.dtype}: audit it in one of {', '.join(DTYPES)}")
    config = getattr(model, "config", None)
    name = str(name or getattr(config, "_name_or_path", "") or getattr(config, "model_type", type(model).__name__))
    chosen = AuditSettings(checkpoint=name, device=str(parameter.device), dtype=dtype, **settings)
    folder = checked_out(chosen, out)
    session = ReplaySession.of_model(
        controlled_model(model, chosen.controllers, chosen.only_controllers), tokenizer, chosen, folder
    )
    to_dict = getattr(config, "to_dict", None)
    config_record = to_dict() if callable(to_dict) else {"model_type": name}
    source = {"path": f"{IN_MEMORY}{name}", "hub": None, "configuration": configuration(config_record)}
    audit = audit_session(session, folder, source, lock_wait)
    assert audit is not None  # one process: it leads
    return audit


def checked_out(settings: AuditSettings, out: str | Path) -> Path:
    """The output folder (``check_audit_out``), with a file where a cache folder belongs refused before anything
    is claimed."""
    out = check_audit_out(out)
    for split in (EVAL, CALIBRATION):
        check_folder_path(split_cache(settings.cache, out, split), "the coefficient cache")
    return out


def audit_session(
    session: ReplaySession, out: Path, source: dict, lock_wait: float, capture_only: bool = False
) -> dict | None:
    """The audit's line (``run_audit``) on an open session writing into ``out`` (``checked_out``); ``source``:
    where its model came from (``audit.json``'s ``model.path`` and ``model.hub``)."""
    ranks = session.ranks
    model, eval_windows, calib_windows = session.model, session.windows(EVAL), session.windows(CALIBRATION)
    settings = session.fitted_settings
    check_ranks(session)
    with (
        cache_lock(cache_root(settings.cache, out), lock_wait, ranks),
        folder_lock(out, "output folder", lock_wait, ranks),
    ):
        if ranks.lead:
            mark_output(out, AUDIT_COMMAND)
        session.capture_all()
        if capture_only:
            return None
        eval_cache, profiles = session.eval_cache, session.profiles if session.has_controller else None
        share = ranks.share(eval_cache.num_shards())
        per_token = ranks.gather(session.replay(progress(session.conditions, desc="replay", unit="condition"), share))
        spread = session.spread()
        counts = bootstrap_counts(len(eval_windows), settings.resamples, settings.seed)
        if settings.per_layer:
            sweep = ranks.gather(session.sweep(session.conditions, share)) if session.has_controller else ({}, None)
        if not ranks.lead:
            return None
        audit = {
            "schema": AUDIT_SCHEMA,
            "model": {
                **source,
                "arch": model.arch,
                "params": sum(p.numel() for p in model.parameters()),
                "fingerprint": eval_cache.manifest["model_fingerprint"],
                "controllers": list(model.controller_names),
                "controller_layers": list(model.controller_layers),
                "slot_labels": [model.slot_labels(i) for i in range(len(model.controller_names))],
                **model.controller_record(),
            },
            "data": {"eval": session.data_summary(EVAL), "calibration": session.data_summary(CALIBRATION)},
            "settings": {**asdict(settings), "world_size": ranks.world_size},
            **session.figures(per_token, counts),
            "static_profiles": None,  # its sha256, once written (write_outputs)
            **spread,
            "execution": {
                **execution_figures(model, eval_windows, calib_windows, session.batch_size, settings.latency_repeats),
                **expert_execution(model, eval_cache),
            },
        }
        audit["settings"]["window_sampling"] = window_sampling(settings.max_windows)
        if settings.per_layer:
            audit.update(per_layer_rows(sweep[0], sweep[1], counts, model.controller_names))
            audit["settings"]["per_layer_mode"] = sweep_mode(model)
        audit["verdict"] = verdicts(audit)
        write_outputs(out, audit, per_token, eval_windows, profiles)
        return audit


def check_ranks(session: ReplaySession) -> None:
    """Before anything is written: every rank has the same model, windows and settings (paths aside: nodes
    may mount them differently), and at least one shard of each set it captures (no calibration capture
    without a controller)."""
    eval_windows, calib_windows = session.windows(EVAL), session.windows(CALIBRATION)
    captured = session.has_controller
    session.ranks.agree(
        lambda: {
            "model": session.fingerprint,
            "eval windows": fingerprint_tensor(eval_windows),
            "calibration windows": fingerprint_tensor(calib_windows) if captured else None,
            "settings": session.fitted_settings.without_paths(),
        }
    )
    sets = {EVAL: eval_windows, CALIBRATION: calib_windows if captured else None}
    size = session.batch_size
    session.ranks.check_shards({name: shard_count(len(w), size) for name, w in sets.items() if w is not None})


def execution_figures(
    model: ControlledModel,
    eval_windows: torch.Tensor,
    calib_windows: torch.Tensor,
    batch_size: int,
    latency_repeats: int,
) -> dict:
    """Execution counted on the first batches (a full extra pass would add nothing), latency vs the model's
    baseline (a shape-matched Dense; for routers the static mixture, every expert run for every token).

    Where the model has a positive control (a copy that really skips work), it is audited the same way and
    recorded with the settings that make it skip, so the report shows what a real saving would look like
    next to the model's own figures.
    """
    counted = eval_windows[: EXECUTION_BATCHES * batch_size]
    execution = execution_audit(model, counted, batch_size, latency_repeats)
    execution["windows_counted"] = len(counted)
    control = model.positive_control(calib_windows[: EXECUTION_BATCHES * batch_size])
    if control is not None:
        figures = execution_audit(control.model, counted, batch_size, latency_repeats)
        execution["positive_control"] = {**figures, **control.settings}
    return execution


def write_outputs(out: Path, audit: dict, per_token: dict, windows: torch.Tensor, profiles: Profiles | None) -> None:
    """The audit's files, once every figure is computed and checked: the static profiles (their sha256 into
    ``audit``), the per-token NLLs, then ``audit.json`` (strict JSON), so a failure leaves no ``audit.json``."""
    validate_audit(audit)
    if profiles is not None:
        bound = audit_binding(audit, ["calibration"])  # the profiles': the model and the calibration windows
        audit["static_profiles"] = {"sha256": save_profiles(out / PROFILES_FILE, profiles, bound)}
    for name, data in per_token_files(per_token, windows, audit_binding(audit)).items():  # CSV, Parquet with pyarrow
        write_atomic(out / name, data)
    write_json(out / AUDIT_FILE, audit)
