"""The run folder of ``fca train``: its settings, the saved training state, the loss log, and resuming.

The run's whole state (weights, optimizer, scheduler, step) is one ``trainer_state.pt`` written
atomically, so an interrupted run resumes exactly; ``train_log.csv`` holds one row per step. A folder is
refused before any work when the finished checkpoint would replace files this trainer did not write.
"""

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from fca_workbench.errors import UserError, first_line
from fca_workbench.files import atomic_path, write_atomic
from fca_workbench.results.outputs import output_folder

STATE_FILE = "trainer_state.pt"
STATE_KEYS = {"settings", "step", "model", "optimizer", "scheduler"}
LOG_FILE = "train_log.csv"
# Every file a finished checkpoint may hold (tests/test_hardening.py checks it against real runs).
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model_card.json",
    "README.md",
    LOG_FILE,
)


@dataclass
class TrainSettings:
    arch: str | None = None  # a workbench family, or None with hf_config
    hf_config: dict | None = None  # a transformers config's fields, model_type included (see read_hf_config)
    seed: int = 0
    train_data: str | None = None  # any UTF-8 text or JSONL; default: the shipped train split
    layers: int | None = 4  # layers, width, heads and gate_groups shape arch models; hf_config has its own
    width: int | None = 96
    heads: int | None = 4
    gate_groups: int | None = None
    gate_range: str | None = None  # FeatureGate only (None: the config's default, 2sigmoid)
    gate_input: str | None = None  # FeatureGate only (None: the config's default, normed)
    window: int = 256
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    controller_weight_decay: float | None = None  # the controllers' weights (None: weight_decay)
    controller_lr_mult: float = 1.0  # the controllers' learning rate is lr times this
    save_every: int = 100
    eval_windows: int = 64
    device: str = "cpu"
    audit_every: int | None = None  # mini-audit every N steps and at the end (training_audit.py)
    audit_windows: int = 16

    def __post_init__(self):
        if (self.arch is None) == (self.hf_config is None):
            raise UserError("give exactly one of --arch and --hf-config")
        if self.hf_config is not None:
            self.layers = self.width = self.heads = self.gate_groups = None
        design = [k for k in ("gate_range", "gate_input") if getattr(self, k) is not None]
        if design and self.arch != "featuregate":
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in design)
            raise UserError(f"{flags} shape FeatureGate controllers; {self.name} has none")
        if not (math.isfinite(self.controller_lr_mult) and self.controller_lr_mult > 0):
            raise UserError(f"--controller-lr-mult must be a positive number, got {self.controller_lr_mult}")
        if self.controller_weight_decay is not None and not (
            math.isfinite(self.controller_weight_decay) and self.controller_weight_decay >= 0
        ):
            raise UserError(f"--controller-weight-decay must be 0 or more, got {self.controller_weight_decay}")

    @property
    def name(self) -> str:
        if self.arch:
            return self.arch
        assert self.hf_config is not None  # __post_init__: exactly one of the two
        return self.hf_config["model_type"]


def run_folder(out: str | Path) -> Path:
    """The run's folder, refused before any work when it is a file, a finished checkpoint, or holds
    files the finished checkpoint would replace that this trainer did not write (a user's README.md ...)."""
    out = output_folder(out)
    running = (out / STATE_FILE).is_file()
    if not running and (out / "config.json").exists():
        raise UserError(f"{out} already holds a finished checkpoint; choose another --out")
    ours = {LOG_FILE} if running else set()
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
    path = out / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch and pickle raise many types on foreign or damaged files
        raise UserError(
            f"{path} is not a training state fca train wrote ({first_line(exc)}); remove it or choose another --out"
        ) from None
    if not isinstance(state, dict) or not STATE_KEYS <= state.keys() or not isinstance(state["settings"], dict):
        raise UserError(f"{path} is not a training state fca train wrote; remove it or choose another --out")
    wanted = asdict(settings)
    if state["settings"] != wanted:
        changed = sorted(
            k
            for k in state["settings"].keys() | wanted.keys()
            if state["settings"].get(k) != wanted.get(k) or (k in state["settings"]) != (k in wanted)
        )
        raise UserError(f"{out} holds a run with different settings ({', '.join(changed)}); choose another --out")
    return state


def restore(state: dict | None, model: torch.nn.Module, optimizer: Optimizer, scheduler: LRScheduler) -> int:
    """Load a saved state into the freshly built run; returns the step to continue from."""
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["step"]


def read_log(out: Path, step: int) -> list[dict]:
    """The training log's rows up to ``step``: those a resumed run keeps (later ones were not checkpointed)."""
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
    with atomic_path(out / STATE_FILE) as tmp:
        torch.save(state, tmp)
    write_log(out, log_rows)
