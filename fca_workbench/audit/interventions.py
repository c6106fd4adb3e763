"""Interventions: pure, seeded functions that reassign cached coefficients.

Each takes per-layer, batch-first coefficient tensors ``[B, T, *slot]`` (or the indices that select them)
and returns new ones; none touches a model. Randomness always comes from an explicit seed.
"""

from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch

from fca_workbench.adapters.kinds import top_k
from fca_workbench.results.conditions import (
    GLOBAL_MEAN,
    LAYER_MEAN,
    LAYER_MEAN_TOPK,
    LAYER_POSITION_MEAN,
    LAYER_SCALAR,
    RANDOM_TOPK,
)

ROUTER_TOP_K = "router_top_k"  # a profiles entry, not a condition: per controller its k (0: routes to no experts)

Layer = TypeVar("Layer")  # what one layer holds: its coefficients, or a controller's values by name


def derangement(n: int, seed: int) -> torch.Tensor:
    """A uniformly random permutation of ``range(n)`` with no fixed point (window i never keeps its own)."""
    if n < 2:
        raise ValueError(f"cross-input reassignment needs at least 2 windows, got {n}")
    generator = torch.Generator().manual_seed(seed)
    while True:  # rejection sampling: about e tries on average, and exactly uniform over derangements
        permutation = torch.randperm(n, generator=generator)
        if not (permutation == torch.arange(n)).any():
            return permutation


def position_permutations(window_indices: torch.Tensor, length: int, seed: int) -> torch.Tensor:
    """One permutation of positions per window ``[B, T]``, seeded by (seed, window index).

    Seeding per window makes a window's shuffle independent of how windows are batched.
    """
    rows = []
    for index in window_indices.tolist():
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
        rows.append(torch.randperm(length, generator=generator))
    return torch.stack(rows)


def causal_positions(window_indices: torch.Tensor, length: int, seed: int) -> torch.Tensor:
    """Per window ``[B, T]``, for each position t a uniformly random position at or before it, seeded by (seed,
    window index): a shuffle that never hands a causal model coefficients computed from later tokens."""
    rows = []
    for index in window_indices.tolist():
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
        rows.append((torch.rand(length, generator=generator, dtype=torch.float64) * torch.arange(1, length + 1)).long())
    return torch.stack(rows)


def shuffle_positions(coefficients: list[torch.Tensor], permutations: torch.Tensor) -> list[torch.Tensor]:
    """Move each window's coefficients to permuted positions, the same permutation at every layer.

    Output position t receives the coefficients of position ``permutations[b, t]``; tokens stay put.
    """
    out = []
    for tensor in coefficients:
        index = permutations.view(*permutations.shape, *([1] * (tensor.dim() - 2))).expand_as(tensor)
        out.append(tensor.gather(1, index))
    return out


def static_profiles(batches: Iterable[list[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    """The static profiles of section 4, from an iterable of per-layer coefficient batches.

    Returns, per profile, one tensor per layer that broadcasts against ``[T, *slot]``: a scalar for
    ``global_mean`` and ``layer_scalar``, ``[*slot]`` for ``layer_mean``, ``[T, *slot]`` for
    ``layer_position_mean``. Feed it calibration windows only.
    """
    return profiles_from_sums(*profile_sums(batches))


def profile_sums(batches: Iterable[list[torch.Tensor]]) -> tuple[list[torch.Tensor] | None, int]:
    """Per layer, the float64 sum over windows ``[T, *slot]``, and the number of windows: what the static
    profiles are made of, and what processes that each saw some of the windows add up."""
    sums, windows = None, 0
    for coefficients in batches:
        batch_sums = [c.double().sum(dim=0) for c in coefficients]
        sums = batch_sums if sums is None else [a + b for a, b in zip(sums, batch_sums)]
        windows += coefficients[0].shape[0]
    return sums, windows


def profiles_from_sums(sums: list[torch.Tensor] | None, windows: int) -> dict[str, list[torch.Tensor]]:
    """The static profiles (``static_profiles``) from ``profile_sums``."""
    if sums is None or windows == 0:
        raise ValueError("static profiles need at least one calibration window")
    position_mean = [s / windows for s in sums]
    layer_mean = [p.mean(dim=0) for p in position_mean]
    layer_scalar = [p.mean() for p in position_mean]
    entries = [p.numel() for p in position_mean]
    total: torch.Tensor = sum(p.sum() for p in position_mean)  # type: ignore[assignment]  # tensors sum to a tensor
    global_mean = total / sum(entries)
    return {
        GLOBAL_MEAN: [global_mean.float() for _ in position_mean],
        LAYER_SCALAR: [s.float() for s in layer_scalar],
        LAYER_MEAN: [m.float() for m in layer_mean],
        LAYER_POSITION_MEAN: [p.float() for p in position_mean],
    }


def layer_mean_topk(layer_mean: list[torch.Tensor], top_k: list[int | None]) -> list[torch.Tensor]:
    """Per router (``top_k[l]`` = its k), the k experts with the largest mean gate, the others zero, rescaled
    to the layer mean's total gate: the mean weight mass a token gets, i.e. 1 for families that renormalise
    their top-k weights (times their scaling factor), the mean top-k probability mass for those that do
    not. Controllers that select no experts (k None) keep their ``layer_mean``."""
    out = []
    for mean, k in zip(layer_mean, top_k):
        if k is None:
            out.append(mean)
            continue
        top = mean.topk(k, dim=-1)
        kept = torch.zeros_like(mean).scatter(-1, top.indices, top.values)
        out.append(kept * (mean.sum(-1, keepdim=True) / kept.sum(-1, keepdim=True)))
    return out


def routing_top_k(values: list[dict]) -> list[int | None]:
    """Per controller, a router's k (its kind's ``top_k`` of the captured values); None for other controllers."""
    return [top_k(value) for value in values]


def uniform_top_k(layer_mean: list[torch.Tensor], top_k: list[int | None]) -> list[torch.Tensor]:
    """Per router, the template ``random_topk`` draws from: the first k of its E experts at an equal share of the
    layer mean's total gate (the routed mass ``layer_mean_topk`` keeps), the others zero; ``random_experts``
    permutes the experts per window. Controllers that select no experts keep their ``layer_mean``."""
    out = []
    for mean, k in zip(layer_mean, top_k):
        if k is None:
            out.append(mean)
            continue
        template = torch.zeros_like(mean)
        template[..., :k] = mean.sum(-1, keepdim=True) / k
        out.append(template)
    return out


def random_experts(
    template: list[torch.Tensor], top_k: list[torch.Tensor], window_indices: torch.Tensor, length: int, seed: int
) -> list[torch.Tensor]:
    """Per controller ``[B, T, E]``: a router's ``uniform_top_k`` template with its experts permuted by one seeded
    permutation per (window, controller), the same at every position, so each window gets k experts drawn
    uniformly at random (averaging over windows averages over draws); ``top_k`` 0 (no router): the template."""
    out = []
    for layer, (value, k) in enumerate(zip(template, top_k)):
        if int(k) == 0:
            out.append(value.expand(len(window_indices), length, *value.shape).contiguous())
            continue
        rows = []
        for index in window_indices.tolist():
            generator = torch.Generator().manual_seed((seed * 1_000_003 + index) * 1_009 + layer)
            rows.append(value[..., torch.randperm(value.shape[-1], generator=generator)])
        out.append(torch.stack(rows).unsqueeze(1).expand(-1, length, *value.shape).contiguous())
    return out


def with_routing_profiles(profiles: dict, top_k: list[int | None]) -> dict:
    """``profiles`` plus ``layer_mean_topk``, the ``random_topk`` template and each controller's k
    (``ROUTER_TOP_K``) when any controller is a router (``top_k`` from ``routing_top_k``)."""
    if any(k is not None for k in top_k):
        profiles[LAYER_MEAN_TOPK] = layer_mean_topk(profiles[LAYER_MEAN], top_k)
        profiles[RANDOM_TOPK] = uniform_top_k(profiles[LAYER_MEAN], top_k)
        profiles[ROUTER_TOP_K] = [torch.tensor(k or 0) for k in top_k]
    return profiles


def broadcast_profile(
    profile: list[torch.Tensor], slot_shapes: Sequence[tuple[int, ...]], batch: int, length: int
) -> list[torch.Tensor]:
    """A static profile expanded to per-layer coefficient tensors ``[B, T, *slot]``."""
    out = []
    for value, slot in zip(profile, slot_shapes):
        if value.dim() == len(slot) + 1:  # per-position profile: use the first ``length`` positions
            if value.shape[0] < length:
                raise ValueError(f"position profile covers {value.shape[0]} positions, the window has {length}")
            value = value[:length]
        out.append(value.expand(batch, length, *slot).contiguous())
    return out


def restrict_to(intervened: list[Layer], correct: list[Layer], controllers: Iterable[int]) -> list[Layer]:
    """Apply an intervention at ``controllers`` only (controller indices: one decoder layer's, or one controller
    alone); every other controller keeps its correct values."""
    chosen = set(controllers)
    outside = sorted(c for c in chosen if not 0 <= c < len(correct))
    if not chosen or outside:
        raise ValueError(f"controllers {outside or '[]'} are out of range: the model has {len(correct)} controllers")
    return [intervened[i] if i in chosen else correct[i] for i in range(len(correct))]
