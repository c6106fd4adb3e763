"""``fca audit``: capture, replay under every condition, figures, execution: one ``audit.json``.

This is orchestration only; every number comes from capture, replay, metrics and execution. Under torchrun
the same line runs on every rank, each on its share of the shards (``distributed.py``); rank 0 writes.
"""

from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.loading import load_controlled
from fca_workbench.adapters.placement import check_device, placed, placement
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.budget import audit_batch_size
from fca_workbench.audit.cache_lock import cache_lock, folder_lock
from fca_workbench.audit.capture import CoefficientCache, capture, model_fingerprint, shard_count
from fca_workbench.audit.conditions import Profiles, calibration_profiles, replay_conditions
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.execution import execution_audit, expert_execution
from fca_workbench.audit.guard import check_correct_replay
from fca_workbench.audit.metrics import VarianceAccumulator, bootstrap_counts, condition_figures, gap_retention
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.settings import PATH_SETTINGS, AuditSettings
from fca_workbench.audit.sweep import per_layer_rows, per_layer_window_nll, sweep_mode
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows, window_sampling
from fca_workbench.errors import UserError
from fca_workbench.files import write_atomic, write_json
from fca_workbench.fingerprints import fingerprint_tensor
from fca_workbench.models.hub import Checkpoint, checkpoint_name, resolve_checkpoint
from fca_workbench.results.conditions import INTERVENTIONS, retention_profiles
from fca_workbench.results.layout import AUDIT_FILE, PROFILES_FILE, cache_root, split_cache
from fca_workbench.results.outputs import check_output, mark_output, output_folder, refuse_foreign
from fca_workbench.results.per_token import per_token_files
from fca_workbench.results.profiles import save_profiles
from fca_workbench.results.schema import AUDIT_SCHEMA, validate_audit
from fca_workbench.results.verdicts import verdicts

AUDIT_COMMAND = "fca audit"  # what an audit folder's marker names


EXECUTION_BATCHES = 4  # execution is counted on the first batches: a full extra pass would add nothing


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # settings.DTYPE_NAMES


def default_out(checkpoint: str | Path) -> Path:
    return Path("results") / f"audit-{checkpoint_name(checkpoint)}"


def check_audit_out(out: str | Path) -> Path:
    """The audit's output folder, refused before any work when it is a file, holds an ``audit.json`` this
    workbench did not write (anything that is not a valid ``fca-audit/1`` audit), or holds files without the
    marker of an audit folder (``check_output``; a valid ``audit.json`` of an earlier version adopts it)."""
    out = output_folder(out)
    refuse_foreign(out / AUDIT_FILE, AUDIT_SCHEMA, validate_audit)
    return check_output(out, AUDIT_COMMAND, adopt=lambda folder: (folder / AUDIT_FILE).is_file())


def load_audit_inputs(
    settings: AuditSettings, out: Path | None = None, ranks: Ranks = SINGLE, checkpoint: Checkpoint | None = None
) -> tuple[ControlledModel, tuple[Path, torch.Tensor], tuple[Path, torch.Tensor]]:
    """Model, tokenizer-made eval and calibration windows, each problem a one-line UserError."""
    model, tokenizer = load_audit_model(settings, out, ranks, checkpoint)
    return (
        model,
        audit_windows(settings, "eval", model, tokenizer),
        audit_windows(settings, "calibration", model, tokenizer),
    )


def load_audit_model(
    settings: AuditSettings, out: Path | None = None, ranks: Ranks = SINGLE, checkpoint: Checkpoint | None = None
) -> tuple[ControlledModel, PreTrainedTokenizerBase]:
    """The controlled model (on the settings' device and dtype, or placed across devices, CPU and disk by
    big-model inference: ``placement.placement``, its offload folder outside the checkpoint, the output folder and
    the cache, under torchrun on this rank's own devices) and its tokenizer, checked against each other, both
    from ``checkpoint`` (default: ``settings.checkpoint`` resolved, ``models.hub``)."""
    check_device(settings.device)
    checkpoint = checkpoint or resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)
    outside = {"checkpoint": checkpoint.folder, "coefficient cache": settings.cache, "output folder": out}
    place = placement(
        settings.device_map, settings.max_memory, settings.offload_folder, settings.device, outside, ranks
    )
    folder = checkpoint.folder
    model = placed(  # offloaded weights, if any, removed with the model
        place,
        lambda place: load_controlled(
            folder,
            DTYPES[settings.dtype],
            settings.controllers,
            settings.trust_remote_code,
            settings.only_controllers,
            place,
        ),
    )
    if settings.device_map is None:
        model.to(settings.device)
    tokenizer = load_tokenizer(folder)
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(
            f"the tokenizer in {settings.checkpoint} has {len(tokenizer)} tokens, more than the model's "
            f"vocabulary of {model.config.vocab_size}: they do not belong together"
        )
    return model, tokenizer


def audit_windows(
    settings: AuditSettings, split: str, model: ControlledModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[Path, torch.Tensor]:
    """The text file of ``split`` (``eval`` or ``calibration``: the settings' own, else the shipped split) and
    its windows of ``settings.window`` tokens (default: min(256, the model's context))."""
    window = settings.window or min(256, model.context_length)
    if window > model.context_length:
        raise UserError(f"window of {window} tokens is longer than the model's context of {model.context_length}")
    given = settings.eval if split == "eval" else settings.calibration
    path = Path(given) if given else split_path(split)
    windows = load_windows(path, tokenizer, window, settings.max_windows)
    if split == "eval" and len(windows) < 2:
        raise UserError(f"{path} gives {len(windows)} window of {window} tokens; the audit needs at least 2")
    return path, windows


def run_audit(settings: AuditSettings, out: str | Path, ranks: Ranks = SINGLE, lock_wait: float = 0.0) -> dict | None:
    """Run the full audit and write ``audit.json``, ``per_token_nll.csv.gz`` and the static profiles.

    The line, step by step: capture the eval and calibration coefficients (``capture_split``); the calibration
    set's static profiles (``conditions.calibration_profiles``); frozen replay of every eval window under every
    condition (``replay_every_condition``); from the per-window NLLs, every condition's NLL and ΔNLL and the
    profiles' gap retention (``replay_figures``); the variance decomposition and variation of the eval
    coefficients (``spread_figures``); execution counted on the first batches and timed (``execution_figures``,
    ``execution.expert_execution``). The mini-audit (``mini.py``) runs these same steps on fewer windows.

    With ``settings.per_layer``, every condition is also replayed at each layer alone (``sweep.py``).
    ``ranks`` (``distributed.process_group``, under torchrun): each rank captures and replays its share of the
    shards; rank 0 gathers per-window results, computes the figures, writes the outputs and returns the audit
    (the other ranks return None). Another audit holding the cache folder is waited for ``lock_wait`` seconds.
    """
    out = check_audit_out(out)
    checkpoint = resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)  # once: its commit recorded
    model, (eval_path, eval_windows), (calib_path, calib_windows) = load_audit_inputs(settings, out, ranks, checkpoint)
    settings = with_batch_size(settings, model, eval_windows, out, ranks)
    has_controller = bool(model.controllers)
    check_ranks(ranks, model, settings, eval_windows, calib_windows if has_controller else None)
    with (
        cache_lock(cache_root(settings.cache, out), lock_wait, ranks),
        folder_lock(out, "output folder", lock_wait, ranks),
    ):
        if ranks.lead:
            mark_output(out, AUDIT_COMMAND)
        fingerprint = model_fingerprint(model)  # once for both captures
        eval_cache = capture_split(model, eval_windows, "eval", settings, out, ranks, fingerprint)
        share = ranks.share(eval_cache.num_shards())
        profiles = None
        if has_controller:
            calib_cache = capture_split(model, calib_windows, "calibration", settings, out, ranks, fingerprint)
            profiles = calibration_profiles(calib_cache, ranks.share(calib_cache.num_shards()), ranks.sum)
        conditions = replay_conditions(profiles) if has_controller else ("unperturbed",)
        per_token = ranks.gather(
            replay_every_condition(
                model,
                eval_windows,
                eval_cache,
                tqdm(conditions, desc="replay", unit="condition"),
                profiles,
                settings.seed,
                settings.device,
                share,
            )
        )
        spread = coefficient_spread(eval_cache, ranks)
        counts = bootstrap_counts(len(eval_windows), settings.resamples, settings.seed)
        if settings.per_layer:
            swept = [c for c in conditions if c in INTERVENTIONS]
            sweep = (
                ranks.gather(
                    per_layer_window_nll(
                        model, eval_windows, eval_cache, swept, profiles, settings.seed, settings.device, shards=share
                    )
                )
                if swept
                else ({}, None)
            )
        if not ranks.lead:
            return None
        figures = replay_figures(per_token, counts, has_controller, model.replay_tolerance)
        audit = {
            "schema": AUDIT_SCHEMA,
            "model": {
                "path": str(checkpoint.folder.resolve()),
                "hub": checkpoint.provenance(),
                "arch": model.arch,
                "params": sum(p.numel() for p in model.parameters()),
                "fingerprint": eval_cache.manifest["model_fingerprint"],
                "controllers": list(model.controller_names),
                "slot_labels": [model.slot_labels(i) for i in range(len(model.controller_names))],
                **controller_kinds(model),
            },
            "data": {
                "eval": data_summary(eval_path, eval_windows),
                "calibration": data_summary(calib_path, calib_windows),
            },
            "settings": {**asdict(settings), "world_size": ranks.world_size},
            **figures,
            "static_profiles": None,  # its sha256, once written (write_outputs)
            **spread_figures(spread),
            "execution": {
                **execution_figures(model, eval_windows, calib_windows, settings),
                **expert_execution(model, eval_cache),
            },
        }
        audit["settings"]["window_sampling"] = window_sampling(settings.max_windows)
        if settings.per_layer:
            audit["per_layer"] = per_layer_rows(sweep[0], sweep[1], counts)
            audit["settings"]["per_layer_mode"] = sweep_mode(model)
        audit["verdict"] = verdicts(audit)
        write_outputs(out, audit, per_token, eval_windows, profiles)
        return audit


def replay_every_condition(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    conditions: Iterable[str],
    profiles: Profiles | None,
    seed: int,
    device: torch.device | str,
    shards: Iterable[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Per condition, the per-token NLL ``[N, T-1]`` of the frozen replay (``replay.replay_nll``), in the order
    ``conditions`` (any iterable: ``run_audit`` passes a progress bar) gives them."""
    return {
        condition: replay_nll(model, windows, cache, condition, profiles, seed, device=device, shards=shards)
        for condition in conditions
    }


def replay_figures(
    per_token: dict[str, torch.Tensor], counts: torch.Tensor, has_controller: bool, replay_tolerance: float
) -> dict:
    """``replay_check`` (``correct`` against ``unperturbed``, within the model's ``replay_tolerance``, or the
    audit stops: ``guard.check_correct_replay``), ``conditions`` (NLL and ΔNLL against ``correct``, or
    ``unperturbed`` without a controller, with bootstrap CIs) and ``retention`` (gap retention of every replayed
    profile the vocabulary reports) of ``audit.json``, from the per-token NLLs of every replayed condition (every
    window, in order)."""
    check = None
    if has_controller:
        windows = range(len(per_token["correct"]))
        check = check_correct_replay(per_token["correct"], per_token["unperturbed"], replay_tolerance, windows)
    window_nll = {name: nll.double().mean(dim=1) for name, nll in per_token.items()}
    reference = "correct" if has_controller else "unperturbed"
    profiles = retention_profiles(window_nll) if has_controller else ()
    return {
        "replay_check": check,
        "conditions": condition_figures(window_nll, counts, reference=reference),
        "retention": {p: gap_retention(window_nll, p, counts) for p in profiles},
    }


def spread_figures(spread: dict | None) -> dict:
    """``variance`` and ``variation`` of ``audit.json`` from ``coefficient_spread`` (None: no coefficients)."""
    return {
        "variance": None if spread is None else {k: spread[k] for k in VARIANCE_KEYS},
        "variation": None if spread is None else {k: spread[k] for k in VARIATION_KEYS},
    }


def with_batch_size(
    settings: AuditSettings,
    model: ControlledModel,
    eval_windows: torch.Tensor,
    out: str | Path | None,
    ranks: Ranks = SINGLE,
) -> AuditSettings:
    """``settings`` with the batch size filled in when the user gave none (``audit_batch_size``; under
    torchrun the smallest any rank can fit, so every rank cuts the same shards)."""
    if settings.batch_size is not None:
        return settings
    fitted = audit_batch_size(model, eval_windows.shape[1], settings.device, split_cache(settings.cache, out, "eval"))
    return replace(settings, batch_size=ranks.smallest(fitted))


def fitted_batch_size(settings: AuditSettings) -> int:
    """The settings' windows per batch, which ``with_batch_size`` fills in before anything is captured."""
    if settings.batch_size is None:
        raise ValueError("the batch size is fitted (with_batch_size) before anything is captured or counted")
    return settings.batch_size


def capture_split(
    model: ControlledModel,
    windows: torch.Tensor,
    split: str,
    settings: AuditSettings,
    out: str | Path | None,
    ranks: Ranks = SINGLE,
    fingerprint: str | None = None,
) -> CoefficientCache:
    """The coefficient cache of ``split`` (``eval`` or ``calibration``): captured (each rank its share),
    resumed, or reused when a finished capture of the same model and windows is there."""
    return capture(
        model,
        windows,
        split_cache(settings.cache, out, split),
        batch_size=fitted_batch_size(settings),
        device=settings.device,
        desc=f"capture {split}",
        ranks=ranks,
        fingerprint=fingerprint,
    )


def check_ranks(
    ranks: Ranks,
    model: ControlledModel,
    settings: AuditSettings,
    eval_windows: torch.Tensor,
    calib_windows: torch.Tensor | None,
) -> None:
    """Before anything is written: every rank has the same model, windows and settings (paths aside: nodes
    may mount them differently), and at least one shard of each set it captures (``calib_windows`` None:
    no calibration capture)."""
    ranks.agree(
        lambda: {
            "model": model_fingerprint(model),
            "eval windows": fingerprint_tensor(eval_windows),
            "calibration windows": None if calib_windows is None else fingerprint_tensor(calib_windows),
            "settings": {k: v for k, v in asdict(settings).items() if k not in PATH_SETTINGS},
        }
    )
    sets = {"eval": eval_windows, "calibration": calib_windows}
    size = fitted_batch_size(settings)
    ranks.check_shards({name: shard_count(len(w), size) for name, w in sets.items() if w is not None})


def coefficient_spread(cache: CoefficientCache, ranks: Ranks = SINGLE) -> dict | None:
    """Variance decomposition and variation of the cached eval coefficients, one shard at a time (each rank
    its share, the sums added up over the ranks); None on ranks other than 0."""
    accumulator = VarianceAccumulator(origin=[c[0, 0] for c in cache.coefficients([0])])
    for indices in cache.shard_indices(ranks.share(cache.num_shards())):
        accumulator.update(cache.coefficients(indices), int(indices[0]))
    accumulator.combine(ranks.sum, cache.num_windows)
    return accumulator.result() if ranks.lead else None


def execution_figures(
    model: ControlledModel, eval_windows: torch.Tensor, calib_windows: torch.Tensor, settings: AuditSettings
) -> dict:
    """Execution counted on the first batches (a full extra pass would add nothing), latency vs the model's
    baseline (a shape-matched Dense; for routers the static mixture, every expert run for every token).

    Where the model has a positive control (a copy that really skips work), it is audited the same way and
    recorded with the settings that make it skip, so the report shows what a real saving would look like
    next to the model's own figures.
    """
    batch_size = fitted_batch_size(settings)
    counted = eval_windows[: EXECUTION_BATCHES * batch_size]
    execution = execution_audit(model, counted, batch_size, settings.latency_repeats)
    execution["windows_counted"] = len(counted)
    control = model.positive_control(calib_windows[: EXECUTION_BATCHES * batch_size])
    if control is not None:
        figures = execution_audit(control.model, counted, batch_size, settings.latency_repeats)
        execution["positive_control"] = {**figures, **control.settings}
    return execution


VARIANCE_KEYS = ("r2_layer", "r2_layer_slot", "r2_layer_slot_position", "r2_layer_slot_window")


VARIATION_KEYS = ("within_std", "cv", "within_std_per_layer")


def controller_kinds(model: ControlledModel) -> dict:
    """``{"controller_kinds": [...]}``: a foreign model's controller kind per controller (what the report's
    words about static profiles go by); {} for a workbench family, whose controllers its ``arch`` names."""
    if isinstance(model, TransformersControlled):
        return {"controller_kinds": [kind.name for kind in model.kinds]}
    return {}


def data_summary(path: Path, windows: torch.Tensor) -> dict:
    return {
        "source": str(path.resolve()),
        "windows": len(windows),
        "window": windows.shape[1],
        "tokens": windows.numel(),
        "fingerprint": fingerprint_tensor(windows),
    }


def write_outputs(out: Path, audit: dict, per_token: dict, windows: torch.Tensor, profiles: Profiles | None) -> None:
    """The audit's files, once every figure is computed and checked: the static profiles (their sha256 into
    ``audit``), the per-token NLLs, then ``audit.json`` (strict JSON), so a failure leaves no ``audit.json``."""
    validate_audit(audit)
    if profiles is not None:
        audit["static_profiles"] = {"sha256": save_profiles(out / PROFILES_FILE, profiles)}
    for name, data in per_token_files(per_token, windows).items():  # CSV, and Parquet with pyarrow
        write_atomic(out / name, data)
    write_json(out / AUDIT_FILE, audit)
