"""Frozen replay: the model with its controller disabled, fed cached coefficients under a condition.

Because every coefficient comes from the cache, which was filled before any intervention, a change in NLL
here measures assignment dependence only: the controller never sees a perturbed hidden state.
"""

from collections.abc import Iterable, Sequence

import torch

from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.assignment import ConditionCoefficients, Profiles, placed
from fca_workbench.audit.capture import CoefficientCache
from fca_workbench.audit.forward import forward_nll
from fca_workbench.audit.guard import applied_at, require_finite
from fca_workbench.foundation.progress import progress
from fca_workbench.results.conditions import condition_named


@torch.no_grad()
def replay_nll(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    condition: str,
    profiles: Profiles | None = None,
    seed: int = 0,
    controllers: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    shards: Iterable[int] | None = None,
    batches: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-token NLL ``[N, T-1]`` of every window under ``condition`` (the live run: its cached NLL), applied at
    ``controllers`` alone (indices; the others keep their own values) or at every controller (None); with
    ``shards`` (one rank's share), of those shards' windows only; with ``batches``, of those windows, each
    index tensor replayed as one batch (the explorer's one window).

    Batches follow the cache's shards by default, the same grouping capture used, so ``correct`` repeats
    capture's arithmetic exactly. A NaN or inf in any window stops it (``guard.require_finite``).
    """
    named = applied_at(condition, controllers)
    batches = list(cache.shard_indices(shards)) if batches is None else batches
    if condition_named(condition).live:
        indices = torch.cat(list(batches))
        nll = cache.nll(indices)
        require_finite(nll, "NLL", named, indices)
        return nll
    assign = ConditionCoefficients(condition, cache, profiles, seed, controllers, windows)
    model.eval()
    rows = []
    for indices in progress(batches, desc=condition, leave=False, disable=len(batches) < 2):
        batch = windows[indices].to(device)
        values = placed(model, assign.values(indices), device)
        rows.append(forward_nll(model, batch, values)[0].cpu())
        require_finite(rows[-1], "NLL", named, indices)
    return torch.cat(rows)
