"""``fca train``: AdamW with warmup + cosine on random windows of the train split, resumable.

The run's whole state (weights, optimizer, scheduler, step) is one ``trainer_state.pt`` written
atomically, so an interrupted run resumes exactly; the batch of step s is drawn from a generator seeded
with (seed, s), so a resumed run sees the same data as an uninterrupted one.
"""

import contextlib
import csv
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data import CORPUS_DIR, TOKENIZER_DIR, load_windows, read_documents, split_path, token_stream, write_atomic
from .errors import UserError
from .models import FAMILIES, next_token_nll
from .tokenizer import load_tokenizer
from .training_audit import TrainingAudit, postfix

STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.csv"


@dataclass
class TrainSettings:
    arch: str
    seed: int = 0
    train_data: str | None = None  # any UTF-8 text or JSONL; default: the shipped train split
    layers: int = 4
    width: int = 96
    heads: int = 4
    gate_groups: int | None = None
    window: int = 256
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    save_every: int = 100
    eval_windows: int = 64
    device: str = "cpu"
    audit_every: int | None = None  # mini-audit every N steps and at the end (training_audit.py)
    audit_windows: int = 16


def build_model(settings: TrainSettings, vocab_size: int):
    if settings.arch not in FAMILIES:
        raise UserError(f"unknown arch '{settings.arch}'; choose from {sorted(FAMILIES)}")
    config_class, model_class = FAMILIES[settings.arch]
    config = config_class.from_sizes(
        vocab_size=vocab_size,
        layers=settings.layers,
        width=settings.width,
        heads=settings.heads,
        window=settings.window,
        gate_groups=settings.gate_groups,
    )
    torch.manual_seed(settings.seed)
    return model_class(config)


def lr_factor(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model, settings: TrainSettings):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, settings))
    return optimizer, scheduler


def sample_batch(stream: torch.Tensor, step: int, settings: TrainSettings) -> torch.Tensor:
    if len(stream) <= settings.window:
        raise UserError(f"training text has {len(stream)} tokens, not more than one window of {settings.window}")
    generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - settings.window, (settings.batch_size,), generator=generator)
    return torch.stack([stream[s : s + settings.window] for s in starts.tolist()])


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(settings: TrainSettings, out, stop_after: int | None = None) -> dict | None:
    """Train (or resume) into ``out``; ``stop_after`` ends this invocation early, checkpointed.

    Returns the model card's figures when the run completes, None when it stopped early.
    """
    out = Path(out)
    tokenizer = load_tokenizer(TOKENIZER_DIR)
    stream = token_stream(tokenizer, read_documents(settings.train_data or split_path("train")))
    model = build_model(settings, len(tokenizer)).to(settings.device)
    optimizer, scheduler = make_optimizer(model, settings)
    step = resume(out, settings, model, optimizer, scheduler)
    audit = TrainingAudit.for_run(settings, model, tokenizer, out, step)
    out.mkdir(parents=True, exist_ok=True)
    log_rows = read_log(out, step)
    started, elapsed_before = time.perf_counter(), (float(log_rows[-1]["seconds"]) if log_rows else 0.0)
    last_step = settings.steps if stop_after is None else min(settings.steps, step + stop_after)
    model.train()
    latest_audit = postfix(audit.log.rows[-1]) if audit and audit.log.rows else {}
    with tqdm(total=settings.steps, initial=step, desc=f"train {settings.arch} seed {settings.seed}") as bar:
        while step < last_step:
            batch = sample_batch(stream, step, settings).to(settings.device)
            with autocast(settings.device):
                loss = model(batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            log_rows.append(
                {
                    "step": step,
                    "loss": f"{loss.item():.5f}",
                    "lr": f"{scheduler.get_last_lr()[0]:.6g}",
                    "tokens_seen": step * settings.batch_size * settings.window,
                    "seconds": f"{elapsed_before + time.perf_counter() - started:.1f}",
                }
            )
            bar.update(1)
            audited = audit and audit.maybe_run(model, step)
            if audited:
                latest_audit = postfix(audited)
            bar.set_postfix(loss=f"{loss.item():.3f}", **latest_audit)
            if step % settings.save_every == 0 or step == last_step:
                save_state(out, settings, model, optimizer, scheduler, step, log_rows)
    if step < settings.steps:
        return None
    return finish(out, settings, model, tokenizer, log_rows, audit)


def resume(out: Path, settings, model, optimizer, scheduler) -> int:
    state_path = out / STATE_FILE
    if not state_path.is_file():
        if (out / "config.json").exists():
            raise UserError(f"{out} already holds a finished checkpoint; choose another --out")
        return 0
    state = torch.load(state_path, map_location=settings.device, weights_only=False)
    if state["settings"] != asdict(settings):
        changed = sorted(k for k in state["settings"] if state["settings"][k] != asdict(settings).get(k))
        raise UserError(f"{out} holds a run with different settings ({', '.join(changed)}); choose another --out")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["step"]


def read_log(out: Path, step: int) -> list[dict]:
    path = out / LOG_FILE
    if not path.is_file():
        return []
    with path.open() as handle:
        return [row for row in csv.DictReader(handle) if int(row["step"]) <= step]


def write_log(out: Path, rows: list[dict]) -> None:
    lines = ["step,loss,lr,tokens_seen,seconds"] + [
        f"{r['step']},{r['loss']},{r['lr']},{r['tokens_seen']},{r['seconds']}" for r in rows
    ]
    write_atomic(out / LOG_FILE, ("\n".join(lines) + "\n").encode())


def save_state(out: Path, settings, model, optimizer, scheduler, step: int, log_rows: list[dict]) -> None:
    state = {
        "settings": asdict(settings),
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    tmp = out / f".{STATE_FILE}.tmp"
    torch.save(state, tmp)
    tmp.replace(out / STATE_FILE)
    write_log(out, log_rows)


@torch.no_grad()
def coefficient_summary(model, windows: torch.Tensor, batch_size: int = 16) -> tuple[float, float | None]:
    """Eval NLL and the mean within-(layer, slot) std of coefficients over the given windows."""
    model.eval()
    nll_sum, count, per_layer = 0.0, 0, None
    for batch in windows.split(batch_size):
        out = model(batch, return_coefficients=True)
        nll = next_token_nll(out.logits, batch)
        nll_sum, count = nll_sum + nll.sum().item(), count + nll.numel()
        flat = [c.flatten(0, 1).double() for c in out.coefficients]
        per_layer = flat if per_layer is None else [torch.cat(pair) for pair in zip(per_layer, flat)]
    within_std = None
    if per_layer:
        within_std = torch.cat([c.flatten(1).std(dim=0) for c in per_layer]).mean().item()
    return nll_sum / count, within_std


def finish(out: Path, settings, model, tokenizer, log_rows: list[dict], audit: TrainingAudit | None = None) -> dict:
    """Save the final checkpoint (weights, config, tokenizer, log, card) and drop the optimizer state."""
    model = model.float().cpu()
    windows = load_windows(split_path("eval"), tokenizer, settings.window, settings.eval_windows)
    eval_nll, within_std = coefficient_summary(model, windows)
    card = {
        "arch": settings.arch,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_seen": int(log_rows[-1]["tokens_seen"]),
        "final_train_loss": float(log_rows[-1]["loss"]),
        "eval_nll": round(eval_nll, 4),
        "eval_windows": len(windows),
        "within_layer_coefficient_std": None if within_std is None else round(within_std, 4),
        "train_seconds": float(log_rows[-1]["seconds"]),
        "settings": asdict(settings),
    }
    if audit:
        card["audit"] = audit.card(card["train_seconds"])
    staging = out.with_name(f".{out.name}.final")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (staging / "README.md").write_text(model_card_markdown(card))
    shutil.copy(out / LOG_FILE, staging / LOG_FILE)
    for path in staging.iterdir():
        path.replace(out / path.name)
    staging.rmdir()
    (out / STATE_FILE).unlink()
    return card


def model_card_markdown(card: dict) -> str:
    s = card["settings"]
    command = (
        f"fca train --arch {s['arch']} --seed {s['seed']} --layers {s['layers']} --width {s['width']} "
        f"--heads {s['heads']} --window {s['window']} --steps {s['steps']} --batch-size {s['batch_size']} "
        f"--lr {s['lr']}" + (f" --gate-groups {s['gate_groups']}" if s["gate_groups"] else "")
        + (f" --audit-every {s['audit_every']} --audit-windows {s['audit_windows']}" if s.get("audit_every") else "")
        + " --out DIR"
    )
    audit = card.get("audit")
    audit_rows = [] if not audit else [
        f"| mini-audits (`audit_log.csv`: every {audit['every']} steps and at the end, {audit['windows']} windows) "
        f"| {audit['audits']}, {audit['audit_seconds']} s = {100 * audit['fraction_of_training']:.1f}% of training time |"
    ]
    std = card["within_layer_coefficient_std"]
    return "\n".join(
        [
            f"# {card['arch']} (seed {s['seed']})",
            "",
            f"Trained by the FCA workbench on the train split of `{CORPUS_DIR.name}/` (Shakespeare, split by work).",
            "",
            "| figure | value |",
            "|---|---|",
            f"| parameters | {card['params']:,} |",
            f"| tokens seen | {card['tokens_seen']:,} |",
            f"| final train loss (nats) | {card['final_train_loss']} |",
            f"| eval NLL (nats, {card['eval_windows']} windows of {s['window']}) | {card['eval_nll']} |",
            f"| within-(layer, slot) coefficient std | {'n/a (no controller)' if std is None else std} |",
            f"| training time (s, this machine) | {card['train_seconds']} |",
            *audit_rows,
            "",
            f"Reproduce: `{command}`",
            "",
        ]
    )
