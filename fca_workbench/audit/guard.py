"""The two checks every number a figure is computed from passes, whatever path computes it (audit, mini-audit,
per-layer sweep, the dashboard's live view): it is finite, and ``correct`` reproduces ``unperturbed`` within
the model's declared ``replay_tolerance`` (0.0: bit-exact). A failure is one line naming the condition and the
window, raised before anything is written: a figure from NaN, or from a cache that is not this model's, is
worse than none.
"""

from collections.abc import Sequence

import torch

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import LIVE_RUN, REFERENCE

Windows = Sequence[int] | torch.Tensor  # the window index of each row


def applied_at(condition: str, where: str | Sequence[int] | None) -> str:
    """How a message names ``condition`` applied at ``where`` alone: a site's name (``layer 3``, a controller's
    module path) or controller indices; None: at every controller."""
    if where is None:
        return condition
    return f"{condition} at {where if isinstance(where, str) else f'controllers {list(where)}'}"


def require_finite(
    values: torch.Tensor, what: str, condition: str, windows: Windows | None, split: str = "eval"
) -> None:
    """Stop when ``values`` (``[B, ...]``, row b from window ``windows[b]`` of ``split``; ``windows`` None: one
    text that ``split`` names) hold a NaN or an inf; tensors that are not floating point (a router's expert
    indices) cannot, and pass."""
    if not values.is_floating_point() or values.numel() == 0:
        return
    finite = torch.isfinite(values.detach().reshape(len(values), -1)).all(dim=1)
    if bool(finite.all()):
        return
    row = int((~finite).nonzero()[0])
    where = split if windows is None else f"{split} window {int(windows[row])}"
    raise UserError(
        f"non-finite {what} (NaN or inf) under condition '{condition}' in {where}: "
        f"no figure is computed from it (are the model's weights finite?)"
    )


def check_correct_replay(correct: torch.Tensor, unperturbed: torch.Tensor, tolerance: float, windows: Windows) -> dict:
    """``{"max_abs_difference", "tolerance"}`` of the per-token NLLs ``[N, T-1]`` of ``correct`` (the frozen
    replay of the cached coefficients) against ``unperturbed`` (the live run); stops when they differ by more
    than ``tolerance``: then the cache is not this model's and windows', or the replay does not do what the
    method says, and every ΔNLL would measure that instead of assignment dependence."""
    difference = (correct.double() - unperturbed.double()).abs()
    if difference.numel() == 0:
        return {"max_abs_difference": 0.0, "tolerance": tolerance}
    per_window = difference.reshape(len(difference), -1).amax(dim=1)
    worst = int(per_window.argmax())
    largest = float(per_window[worst])
    if not largest <= tolerance:  # a NaN difference fails too
        raise UserError(
            f"the frozen replay of '{REFERENCE}' does not reproduce the {LIVE_RUN} run: eval window "
            f"{int(windows[worst])} differs by {largest:.3g} nats, more than the {tolerance:g} this model family "
            f"allows; no figure is computed (a coefficient cache of another model or other windows? delete it "
            f"to capture again)"
        )
    return {"max_abs_difference": largest, "tolerance": tolerance}
