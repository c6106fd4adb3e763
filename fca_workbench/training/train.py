"""``fca train``: AdamW with warmup + cosine on random windows of the train split, resumable.

The run folder's state, log and resuming are ``train_state``'s; the batch of step s is drawn from a generator
seeded with (seed, s), so a resumed run sees the same data as an uninterrupted one.

Besides the workbench's own families (``arch``), any built-in ``transformers`` causal-LM config can be
trained (``hf_config``: the fields of a config JSON file with its ``model_type``; which ones, and how they are
built: ``hf_config``). Its objective is the same next-token NLL plus, for mixture-of-experts
configs (those with ``router_aux_loss_coef``), that coefficient times transformers' router load-balancing
loss, which ``transformers`` adds only when ``output_router_logits`` is set; here it is always added while
training (set the coefficient to 0 to train without it) and the saved config keeps the file's setting.

A fine-tune starts from a transformers checkpoint instead (``init``, ``hf_config.load_initial``), with the same
loop, schedule and card; ``--freeze-routers`` keeps an exported static profile's zero routers as they are.

A step whose loss or gradient is not finite stops the run in one line before the update: the run folder keeps
its last checkpoint, and a folder this invocation created with nothing saved in it is removed.
"""

import contextlib
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fca_workbench.audit.cache_lock import folder_lock, lock_path
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import TOKENIZER_DIR, load_tokenizer
from fca_workbench.data.windows import load_windows, read_documents, token_stream, window_sampling
from fca_workbench.foundation.checkpoint import CARD_FILE, TRAIN_CARD_FILE, TRAIN_LOG_FILE, TRAIN_STATE_FILE
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import write_json
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.foundation.progress import progress
from fca_workbench.models import FAMILIES, next_token_nll
from fca_workbench.models.limits import (
    check_sizes,
)
from fca_workbench.training.hf_config import build_hf_model, check_training_memory, load_initial
from fca_workbench.training.routing import prepare_routers, router_z_loss
from fca_workbench.training.train_card import training_model_card
from fca_workbench.training.train_settings import TrainSettings
from fca_workbench.training.train_state import (
    CHECKPOINT_FILES,
    read_log,
    read_state,
    restore,
    run_folder,
    save_state,
)
from fca_workbench.training.training_audit import TrainingAudit, postfix

STAGING = ".fca-final"  # the finished checkpoint is assembled here, inside the run folder, then moved up


def build_model(settings: TrainSettings, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The untrained model ``settings`` describe (or the ``--init`` checkpoint it starts from), seeded, sized to
    ``tokenizer`` and checked to fit in memory."""
    if settings.hf_config is not None:
        torch.manual_seed(settings.seed)
        if settings.init is None:
            model = build_hf_model(settings.hf_config, tokenizer, settings.window)
        else:
            model = load_initial(settings.init, tokenizer, settings.window)
        prepare_routers(model, settings)
        return model
    vocab_size = len(tokenizer)
    if settings.arch not in FAMILIES:
        raise UserError(f"unknown arch '{settings.arch}'; choose from {sorted(FAMILIES)}")
    config_class, model_class = FAMILIES[settings.arch]
    try:
        config = config_class.from_sizes(  # type: ignore[attr-defined]  # every native family's config has it
            vocab_size=vocab_size,
            layers=settings.layers,
            width=settings.width,
            heads=settings.heads,
            window=settings.window,
            gate_groups=settings.gate_groups,
            **gate_design(settings),
        )
    except (ValueError, ZeroDivisionError) as exc:  # the config classes refuse shapes they cannot build
        raise UserError(f"fca train's model config: {first_line(exc)}") from None
    check_sizes(config, "fca train's model config")
    check_training_memory(lambda: model_class(config))
    torch.manual_seed(settings.seed)
    return model_class(config)


def gate_design(settings: TrainSettings) -> dict[str, str]:
    """The FeatureGate config fields the settings choose (only those given: the others keep the config's defaults)."""
    return {k: v for k in ("gate_range", "gate_input") if (v := getattr(settings, k)) is not None}


def lr_factor(step: int, settings: TrainSettings) -> float:
    """The learning rate's multiplier at ``step``: linear warm-up, then cosine decay to a tenth."""
    if step < settings.warmup:
        return (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def parameter_groups(model: torch.nn.Module, settings: TrainSettings) -> list[dict]:
    """AdamW's groups: weight decay on matrices only, frozen parameters (``--freeze-routers``) left out. The
    controllers' parameters get groups of their own when their weight decay or learning rate differs from the
    model's (``--controller-weight-decay``, ``--controller-lr-mult``); otherwise the two groups are those of
    every run before these options."""
    own_decay = settings.controller_weight_decay
    controllers = getattr(model, "controllers", []) if settings.arch else []
    if (own_decay is not None or settings.controller_lr_mult != 1.0) and not controllers:
        raise UserError(
            f"--controller-weight-decay and --controller-lr-mult need a model with controllers; {settings.name} has none"
        )
    separate = (own_decay is not None and own_decay != settings.weight_decay) or settings.controller_lr_mult != 1.0
    mine = [p for c in controllers for p in c.parameters()] if separate else []
    rest = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in mine)]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": settings.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    lr = settings.lr * settings.controller_lr_mult
    for params, decay in ([p for p in mine if p.dim() >= 2], own_decay), ([p for p in mine if p.dim() < 2], 0.0):
        if params:
            groups.append(
                {"params": params, "weight_decay": settings.weight_decay if decay is None else decay, "lr": lr}
            )
    return groups


def make_optimizer(model: torch.nn.Module, settings: TrainSettings) -> tuple[Optimizer, LRScheduler]:
    """AdamW (``parameter_groups``) with the warm-up and cosine schedule of ``lr_factor``."""
    optimizer = torch.optim.AdamW(parameter_groups(model, settings), lr=settings.lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, settings))
    return optimizer, scheduler


def step_seed(settings: TrainSettings, step: int) -> int:
    """The batch seed of ``step``: a resumed run draws the same batches an uninterrupted one would."""
    return settings.seed * 1_000_003 + step


def sample_batch(stream: torch.Tensor, step: int, settings: TrainSettings) -> torch.Tensor:
    """``batch_size`` random windows of the token stream, drawn from ``step_seed`` alone."""
    if len(stream) <= settings.window:
        raise UserError(f"training text has {len(stream)} tokens, not more than one window of {settings.window}")
    generator = torch.Generator().manual_seed(step_seed(settings, step))
    starts = torch.randint(0, len(stream) - settings.window, (settings.batch_size,), generator=generator)
    return torch.stack([stream[s : s + settings.window] for s in starts.tolist()])


def training_loss(
    model: torch.nn.Module, batch: torch.Tensor, z_loss_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token NLL, the loss to minimise): the NLL plus a MoE config's weighted router load-balancing loss,
    plus ``z_loss_weight`` times the router z-loss (``routing.router_z_loss``) when it is not 0."""
    aux_coef = getattr(model.config, "router_aux_loss_coef", None)
    routed = aux_coef is not None or z_loss_weight != 0
    out = model(batch, **({"output_router_logits": True} if routed else {}))
    nll = next_token_nll(out.logits, batch).mean()
    aux = getattr(out, "aux_loss", None)
    loss = nll if aux is None else nll + aux_coef * aux
    if z_loss_weight != 0:
        loss = loss + z_loss_weight * router_z_loss(out.router_logits)
    return nll, loss


def autocast(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the speed of a GPU run); on the CPU, full precision."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(settings: TrainSettings, out: str | Path, stop_after: int | None = None) -> dict | None:
    """Train (or resume) into ``out``; ``stop_after`` ends this invocation early, checkpointed.

    Returns the model card's figures when the run completes, None when it stopped early.
    """
    out = run_folder(out)
    state = read_state(out, settings)
    tokenizer = load_tokenizer(TOKENIZER_DIR)
    model = build_model(settings, tokenizer)  # a bad config fails before the corpus is read
    # transformers types PreTrainedModel.to as the unbound nn.Module.to (functools.wraps), self included
    model.to(settings.device)  # type: ignore[arg-type]
    stream = token_stream(tokenizer, read_documents(settings.train_data or split_path("train")))
    optimizer, scheduler = make_optimizer(model, settings)
    step = restore(state, model, optimizer, scheduler)
    audit = TrainingAudit.for_run(settings, model, tokenizer, out, step)
    fresh = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with folder_lock(out, "run folder", holder="fca train", hint="let it finish (rerun then to resume)"):
            card = train_steps(settings, out, model, tokenizer, stream, optimizer, scheduler, step, audit, stop_after)
    except Diverged:
        if fresh and not (out / TRAIN_STATE_FILE).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise
    if card is not None:  # a finished checkpoint holds its own files only; no run waits on this lock
        lock_path(out).unlink(missing_ok=True)
    return card


class Diverged(UserError):
    """A step's loss or gradient norm is not finite: the run stops before that step's update."""


def check_finite(value: torch.Tensor, what: str, step: int, out: Path) -> None:
    if not torch.isfinite(value).all():
        kept = f"{out} keeps its last checkpoint" if (out / TRAIN_STATE_FILE).exists() else "no checkpoint was saved"
        raise Diverged(
            f"step {step + 1}: the {what} is {value.item()}; stopped before the update ({kept}; a lower --lr may train)"
        )


def train_steps(
    settings: TrainSettings,
    out: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    stream: torch.Tensor,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    step: int,
    audit: TrainingAudit | None,
    stop_after: int | None,
) -> dict | None:
    """``train``'s steps from ``step`` on, in its run folder, which it holds locked: two runs never write
    one folder's state at once."""
    log_rows = read_log(out, step)
    started, elapsed_before = time.perf_counter(), (float(log_rows[-1]["seconds"]) if log_rows else 0.0)
    last_step = settings.steps if stop_after is None else min(settings.steps, step + stop_after)
    model.train()
    latest_audit = postfix(audit.log.rows[-1]) if audit and audit.log.rows else {}
    with progress(total=settings.steps, initial=step, desc=f"train {settings.name} seed {settings.seed}") as bar:
        while step < last_step:
            batch = sample_batch(stream, step, settings).to(settings.device)
            torch.manual_seed(step_seed(settings, step))  # dropout or router jitter, if a config has them
            with autocast(settings.device):
                nll, loss = training_loss(model, batch, settings.router_z_loss)
            check_finite(loss.detach(), "training loss", step, out)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            check_finite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), "gradient norm", step, out)
            optimizer.step()
            scheduler.step()
            step += 1
            log_rows.append(
                {
                    "step": step,
                    "loss": f"{nll.item():.5f}",
                    "lr": f"{scheduler.get_last_lr()[0]:.6g}",
                    "tokens_seen": step * settings.batch_size * settings.window,
                    "seconds": f"{elapsed_before + time.perf_counter() - started:.1f}",
                }
            )
            bar.update(1)
            audited = audit and audit.maybe_run(model, step)
            if audited:
                latest_audit = postfix(audited)
            bar.set_postfix(loss=f"{nll.item():.3f}", **latest_audit)
            if step % settings.save_every == 0 or step == last_step:
                save_state(out, settings, model, optimizer, scheduler, step, log_rows)
    if step < settings.steps:
        return None
    return finish(out, settings, model, tokenizer, log_rows, audit)


@torch.no_grad()
def coefficient_summary(
    model: torch.nn.Module, windows: torch.Tensor, with_coefficients: bool = True, batch_size: int = 16
) -> tuple[float, float | None]:
    """Eval NLL and the mean within-(layer, slot) std of coefficients (a workbench family's) over the windows."""
    model.eval()
    nll_sum, count, per_layer = 0.0, 0, None
    for batch in windows.split(batch_size):
        out = model(batch, return_coefficients=True) if with_coefficients else model(batch)
        nll = next_token_nll(out.logits, batch)
        nll_sum, count = nll_sum + nll.sum().item(), count + nll.numel()
        flat = [c.flatten(0, 1).double() for c in out.coefficients] if with_coefficients else []
        per_layer = flat if per_layer is None else [torch.cat(pair) for pair in zip(per_layer, flat)]
    within_std = None
    if per_layer:
        within_std = torch.cat([c.flatten(1).std(dim=0) for c in per_layer]).mean().item()
    return nll_sum / count, within_std


def finish(
    out: Path,
    settings: TrainSettings,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    log_rows: list[dict],
    audit: TrainingAudit | None = None,
) -> dict:
    """Save the final checkpoint (weights, config, tokenizer, log, card) and drop the optimizer state."""
    model = model.float().cpu()
    windows = load_windows(split_path("eval"), tokenizer, settings.window, settings.eval_windows)
    eval_nll, within_std = coefficient_summary(model, windows, with_coefficients=settings.arch is not None)
    card: dict[str, Any] = {
        "arch": settings.name,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_seen": int(log_rows[-1]["tokens_seen"]),
        "final_train_loss": float(log_rows[-1]["loss"]),
        "eval_nll": round(eval_nll, 4),
        "eval_windows": len(windows),
        "eval_window_sampling": window_sampling(settings.eval_windows),
        "eval_fingerprint": fingerprint_tensor(windows),
        "within_layer_coefficient_std": None if within_std is None else round(within_std, 4),
        "train_seconds": float(log_rows[-1]["seconds"]),
        "settings": asdict(settings),
    }
    if settings.hf_config is not None:
        card["router_aux_loss_coef"] = getattr(model.config, "router_aux_loss_coef", None)
    if audit:
        card["audit"] = audit.card(card["train_seconds"])
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    write_json(staging / TRAIN_CARD_FILE, card)
    final_audit = audit.log.rows[-1] if audit and audit.log.rows else None
    (staging / CARD_FILE).write_text(str(training_model_card(card, final_audit)))
    shutil.copy(out / TRAIN_LOG_FILE, staging / TRAIN_LOG_FILE)
    staged = sorted(staging.iterdir())
    clashes = [p.name for p in staged if p.name not in CHECKPOINT_FILES and (out / p.name).exists()]
    if clashes:  # a file name CHECKPOINT_FILES does not know yet (a newer transformers): never replace it
        raise UserError(
            f"{out} holds {', '.join(clashes)}, which fca train did not write; "
            f"the finished checkpoint is left in {staging}"
        )
    for path in staged:
        path.replace(out / path.name)
    staging.rmdir()
    (out / TRAIN_STATE_FILE).unlink()
    return card
