"""The replay session of windows a benchmark made itself (seeded random ids, a slice of a split), opened as the
mini-audit opens its own: the users' path, with the windows handed in instead of read from a text file."""

from pathlib import Path

import torch

from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.inputs import CALIBRATION, EVAL
from fca_workbench.audit.session import ReplaySession


def handed_in(
    model: ControlledModel,
    windows: torch.Tensor,
    calibration: torch.Tensor | None = None,
    cache_root: Path | None = None,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    fingerprint: str | None = None,
) -> ReplaySession:
    """A session on ``windows`` (eval) and ``calibration``, its caches under ``cache_root``. ``fingerprint``:
    the model's, when the benchmark took it apart, so a capture is timed as an audit after the checkpoint's
    first runs it (the memo gives it the fingerprint)."""
    splits = {EVAL: lambda: (None, windows)}
    if calibration is not None:
        splits[CALIBRATION] = lambda: (None, calibration)
    session = ReplaySession(model, splits, cache_root=cache_root, device=device, batch_size=batch_size)
    if fingerprint is not None:
        session.fingerprint = fingerprint
    return session
