"""The run folder of ``fca train``: the saved training state, the loss log, and resuming (the settings it is
run with: ``train_settings``).

The run's whole state (weights, optimizer, scheduler, step) is one ``trainer_state.pt`` written
atomically, so an interrupted run resumes exactly; ``train_log.csv`` holds one row per step. A folder is
refused before any work when the finished checkpoint would replace files this trainer did not write.
"""

import csv
from dataclasses import asdict
from pathlib import Path

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from fca_workbench.foundation.checkpoint import (
    CARD_FILE,
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    SAFETENSORS_FILE,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TRAIN_CARD_FILE,
    TRAIN_LOG_FILE,
    TRAIN_STATE_FILE,
)
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import atomic_path, reading, write_atomic
from fca_workbench.results.outputs import output_folder
from fca_workbench.training.train_settings import TrainSettings

STATE_KEYS = {"settings", "step", "model", "optimizer", "scheduler"}
RESUME_ADVICE = "remove it or choose another --out"
LOG_COLUMNS = ["step", "loss", "lr", "tokens_seen", "seconds"]
# Every file a finished checkpoint may hold (tests/test_hardening.py checks it against real runs).
CHECKPOINT_FILES = (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    SAFETENSORS_FILE,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    SPECIAL_TOKENS_FILE,
    TRAIN_CARD_FILE,
    CARD_FILE,
    TRAIN_LOG_FILE,
)


def run_folder(out: str | Path) -> Path:
    """The run's folder, refused before any work when it is a file, a finished checkpoint, or holds
    files the finished checkpoint would replace that this trainer did not write (a user's README.md ...)."""
    out = output_folder(out)
    running = (out / TRAIN_STATE_FILE).is_file()
    if not running and (out / CONFIG_FILE).exists():
        raise UserError(f"{out} already holds a finished checkpoint; choose another --out")
    ours = {TRAIN_LOG_FILE} if running else set()
    clashes = [name for name in CHECKPOINT_FILES if name not in ours and (out / name).exists()]
    if clashes:
        raise UserError(
            f"{out} already holds {', '.join(clashes)}, which fca train did not write and would "
            "replace; choose another --out"
        )
    return out


def read_state(out: Path, settings: TrainSettings) -> dict | None:
    """The saved state of an unfinished run in ``out`` (None: a fresh run), unpickled with
    ``weights_only=True``: tensors and plain containers only, so a planted pickle cannot run code."""
    path = out / TRAIN_STATE_FILE
    if not path.is_file():
        return None
    with reading(f"{path} is not a training state fca train wrote", RESUME_ADVICE):
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not STATE_KEYS <= state.keys() or not isinstance(state["settings"], dict):
            raise UserError(f"{path} is not a training state fca train wrote; {RESUME_ADVICE}")
        changed = changed_settings(state["settings"], asdict(settings))  # a tensor among them: a RuntimeError
    if changed:
        raise UserError(f"{out} holds a run with different settings ({', '.join(changed)}); choose another --out")
    step = state["step"]
    if type(step) is not int or not 0 <= step <= settings.steps:
        raise UserError(f"{path} holds step {str(step)[:40]!r}, not one of 0..{settings.steps}; {RESUME_ADVICE}")
    return state


def changed_settings(saved: dict, wanted: dict) -> list[str]:
    """The names of the settings that differ between a saved run and this one (a planted state's names may
    be of any type and length)."""
    return sorted(
        str(k)[:40]
        for k in saved.keys() | wanted.keys()
        if saved.get(k) != wanted.get(k) or (k in saved) != (k in wanted)
    )


def restore(state: dict | None, model: torch.nn.Module, optimizer: Optimizer, scheduler: LRScheduler) -> int:
    """Load a saved state into the freshly built run; returns the step to continue from."""
    if state is None:
        return 0
    # a state of other shapes or structure than this run's model, optimizer and scheduler
    with reading(f"the {TRAIN_STATE_FILE} in --out does not fit this run", RESUME_ADVICE):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        check_resumed(optimizer, scheduler, state["step"])
    return state["step"]


def check_resumed(optimizer: Optimizer, scheduler: LRScheduler, step: int) -> None:
    """Raise ``ValueError`` where a loaded optimizer or scheduler state would only fail later, mid-training:
    loading neither checks the moments' shapes against the parameters, nor the numbers' types."""
    for group in optimizer.param_groups:
        for name, value in group.items():
            if name != "params" and isinstance(value, str):
                raise ValueError(f"optimizer setting {name} is {value[:40]!r}, not a number")
        for parameter in group["params"]:
            for name, value in optimizer.state.get(parameter, {}).items():
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"optimizer state {name} is not a tensor")
                if value.ndim and value.shape != parameter.shape:
                    raise ValueError(
                        f"optimizer state {name} has shape {list(value.shape)}, its parameter {list(parameter.shape)}"
                    )
    if scheduler.last_epoch != step:
        raise ValueError(f"the scheduler is at step {str(scheduler.last_epoch)[:40]}, the run at {step}")


def read_log(out: Path, step: int) -> list[dict]:
    """The training log's rows up to ``step``: those a resumed run keeps (later ones were not checkpointed)."""
    path = out / TRAIN_LOG_FILE
    if not path.exists():
        return []
    with reading(f"{path} is not a log fca train wrote", RESUME_ADVICE):
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
        for row in rows:  # every field a number: the rows are written again, and the last one is read
            check_log_row(row)
    return [row for row in rows if int(row["step"]) <= step]


def check_log_row(row: dict) -> None:
    """Raise ``ValueError`` unless ``row`` has exactly the log's columns, each a number (the step an integer);
    ``csv.DictReader`` files extra fields under ``None`` and fills missing ones with ``None``."""
    if list(row) != LOG_COLUMNS:
        raise ValueError(f"its columns are not {','.join(LOG_COLUMNS)}")
    int(row["step"])
    for column in LOG_COLUMNS[1:]:
        float(row[column])


def write_log(out: Path, rows: list[dict]) -> None:
    lines = [",".join(LOG_COLUMNS)] + [
        f"{r['step']},{r['loss']},{r['lr']},{r['tokens_seen']},{r['seconds']}" for r in rows
    ]
    write_atomic(out / TRAIN_LOG_FILE, ("\n".join(lines) + "\n").encode())


def save_state(
    out: Path,
    settings: TrainSettings,
    model: torch.nn.Module,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    step: int,
    log_rows: list[dict],
) -> None:
    """Everything a resumed run needs to continue exactly where this one stopped, written atomically."""
    state = {
        "settings": asdict(settings),
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    with atomic_path(out / TRAIN_STATE_FILE) as tmp:
        torch.save(state, tmp)
    write_log(out, log_rows)
