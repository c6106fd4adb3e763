"""What a replay session is opened on: the controlled model and its tokenizer, and the windows of a data split,
each problem a one-line ``UserError`` before any capture."""

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.controlled import open_checkpoint
from fca_workbench.adapters.placement import check_device
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.settings import DEFAULT_WINDOW, AuditSettings
from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import load_windows
from fca_workbench.foundation.checkpoint import Checkpoint, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # settings.DTYPE_NAMES
EVAL, CALIBRATION = "eval", "calibration"  # the two data splits a session reads


def load_audit_model(
    settings: AuditSettings, out: Path | None = None, ranks: Ranks = SINGLE, checkpoint: Checkpoint | None = None
) -> tuple[ControlledModel, PreTrainedTokenizerBase]:
    """The controlled model and its tokenizer (``loading.open_checkpoint``: on the settings' device and dtype,
    or placed by big-model inference with its offload folder outside the checkpoint, the output folder and the
    cache, under torchrun on this rank's own devices), from ``checkpoint`` (default: ``settings.checkpoint``
    resolved). A device that cannot compute is refused before the checkpoint is resolved."""
    check_device(settings.device)
    checkpoint = checkpoint or resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)
    return open_checkpoint(
        checkpoint,
        DTYPES[settings.dtype],
        controllers=settings.controllers,
        only_controllers=settings.only_controllers,
        trust_remote_code=settings.trust_remote_code,
        device=settings.device,
        device_map=settings.device_map,
        max_memory=settings.max_memory,
        offload_folder=settings.offload_folder,
        offload_outside={"coefficient cache": settings.cache, "output folder": out},
        ranks=ranks,
    )


def window_length(settings: AuditSettings, model: ControlledModel) -> int:
    """Tokens per window: the settings' own, else ``DEFAULT_WINDOW`` or the model's context if shorter; longer
    than the context is refused."""
    window = settings.window or min(DEFAULT_WINDOW, model.context_length)
    if window > model.context_length:
        raise UserError(f"window of {window} tokens is longer than the model's context of {model.context_length}")
    return window


def audit_windows(
    settings: AuditSettings, split: str, model: ControlledModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[Path, torch.Tensor]:
    """The text file of ``split`` (``eval`` or ``calibration``: the settings' own, else the shipped split) and
    its windows of ``window_length`` tokens."""
    window = window_length(settings, model)
    given = settings.eval if split == EVAL else settings.calibration
    path = Path(given) if given else split_path(split)
    windows = load_windows(path, tokenizer, window, settings.max_windows)
    if split == EVAL and len(windows) < 2:
        raise UserError(f"{path} gives {len(windows)} window of {window} tokens; the audit needs at least 2")
    return path, windows


def data_summary(path: Path, windows: torch.Tensor) -> dict:
    """What ``audit.json`` records of a split's data: its file, windows and their fingerprint."""
    return {
        "source": str(path.resolve()),
        "windows": len(windows),
        "window": windows.shape[1],
        "tokens": windows.numel(),
        "fingerprint": fingerprint_tensor(windows),
    }
