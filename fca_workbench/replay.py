"""Frozen replay: the model with its controller disabled, fed cached coefficients under a condition.

Because every coefficient comes from the cache, which was filled before any intervention, a change in NLL
here measures assignment dependence only: the controller never sees a perturbed hidden state.
"""

import torch
from tqdm.auto import tqdm

from .capture import CoefficientCache
from .interventions import (
    STATIC_PROFILES,
    broadcast_profile,
    derangement,
    position_permutations,
    restrict_to_layer,
    shuffle_positions,
)
from .models import next_token_nll


class ConditionCoefficients:
    """Builds the coefficients a condition assigns to any batch of eval windows.

    Seeded choices (the cross-input derangement, the per-window shuffles) are fixed once per condition,
    so a window gets the same coefficients however the windows are batched.
    """

    def __init__(self, condition: str, cache: CoefficientCache, profiles=None, seed: int = 0, layer: int | None = None):
        if condition in STATIC_PROFILES and profiles is None:
            raise ValueError(f"condition '{condition}' needs static profiles from a calibration capture")
        if condition not in STATIC_PROFILES and condition not in ("correct", "cross_input", "token_shuffle"):
            raise ValueError(f"unknown replay condition '{condition}'")
        self.condition, self.cache, self.profiles, self.seed, self.layer = condition, cache, profiles, seed, layer
        self.donors = derangement(cache.num_windows, seed) if condition == "cross_input" else None

    def __call__(self, indices: torch.Tensor) -> list[torch.Tensor]:
        correct = self.cache.coefficients(indices)
        batch, length = correct[0].shape[:2]
        if self.condition == "correct":
            intervened = correct
        elif self.condition == "cross_input":
            intervened = self.cache.coefficients(self.donors[indices])
        elif self.condition == "token_shuffle":
            intervened = shuffle_positions(correct, position_permutations(indices, length, self.seed))
        else:
            slot_shapes = [tuple(s) for s in self.cache.manifest["slot_shapes"]]
            intervened = broadcast_profile(self.profiles[self.condition], slot_shapes, batch, length)
        return intervened if self.layer is None else restrict_to_layer(intervened, correct, self.layer)


@torch.no_grad()
def replay_nll(
    model,
    windows: torch.Tensor,
    cache: CoefficientCache,
    condition: str,
    profiles=None,
    seed: int = 0,
    layer: int | None = None,
    device="cpu",
) -> torch.Tensor:
    """Per-token NLL ``[N, T-1]`` of every window under ``condition`` (``unperturbed``: the live run).

    Batches follow the cache's shards, the same grouping capture used, so ``correct`` repeats capture's
    arithmetic exactly.
    """
    if condition == "unperturbed":
        return cache.nll(torch.arange(cache.num_windows))
    assign = ConditionCoefficients(condition, cache, profiles, seed, layer)
    dtype = next(model.parameters()).dtype
    model.eval()
    rows = []
    shards = list(cache.shard_indices())
    for indices in tqdm(shards, desc=condition, leave=False):
        batch = windows[indices].to(device)
        coefficients = [c.to(device=device, dtype=dtype) for c in assign(indices)]
        rows.append(next_token_nll(model(batch, coefficients=coefficients).logits, batch).cpu())
    return torch.cat(rows)
