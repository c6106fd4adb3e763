"""What a condition assigns: the coefficients (or a router's whole output) each eval window gets under it.

The one place that turns a condition name, a coefficient cache and the calibration profiles into replayed values;
the audit, the sweep, the mini-audit, the explorer and the dashboard all go through it.
"""

import torch

from fca_workbench.adapters.protocol import COEFFICIENT
from fca_workbench.audit.capture import CoefficientCache
from fca_workbench.audit.interventions import (
    broadcast_profile,
    derangement,
    position_permutations,
    profile_sums,
    profiles_from_sums,
    restrict_to_layer,
    routing_top_k,
    shuffle_positions,
    with_routing_profiles,
)
from fca_workbench.results.conditions import CONDITIONS, ROUTING_CONDITIONS, STATIC_PROFILES


def calibration_profiles(cache: CoefficientCache, shards=None, total=lambda t: t) -> dict[str, list[torch.Tensor]]:
    """The static profiles of a calibration capture, plus ``layer_mean_topk`` when it holds routers (their
    cached ``top_k_index`` gives k).

    ``shards``: only these shards are read; ``total``: adds a sum up over the processes that read the others
    (``distributed.Ranks.sum``), so every process gets the profiles of the whole calibration set."""
    sums, windows = profile_sums(cache.batches(shards))
    profiles = profiles_from_sums([total(s) for s in sums], int(total(torch.tensor(windows))))
    return with_routing_profiles(profiles, routing_top_k(cache.values(torch.arange(1))))


def replay_conditions(profiles) -> tuple[str, ...]:
    """Every condition a model's audit replays: section 4's, plus the routing ones its profiles allow."""
    return CONDITIONS + tuple(c for c in ROUTING_CONDITIONS if profiles and c in profiles)


class ConditionCoefficients:
    """Builds the coefficients a condition assigns to any batch of eval windows.

    Seeded choices (the cross-input derangement, the per-window shuffles) are fixed once per condition,
    so a window gets the same coefficients however the windows are batched.
    """

    def __init__(self, condition: str, cache: CoefficientCache, profiles=None, seed: int = 0, layer: int | None = None):
        profile_names = STATIC_PROFILES + ROUTING_CONDITIONS
        if condition in profile_names and (profiles is None or condition not in profiles):
            raise ValueError(f"condition '{condition}' needs its static profile from a calibration capture")
        if condition not in profile_names and condition not in ("correct", "cross_input", "token_shuffle"):
            raise ValueError(f"unknown replay condition '{condition}'")
        self.condition, self.cache, self.profiles, self.seed, self.layer = condition, cache, profiles, seed, layer
        self.donors = derangement(cache.num_windows, seed) if condition == "cross_input" else None

    def __call__(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the coefficients ``[B, T, *slot]`` the condition assigns."""
        return [value[COEFFICIENT] for value in self.values(indices)]

    def values(self, indices: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Per controller, the values replayed: ``correct``, ``cross_input`` and ``token_shuffle`` move
        everything cached (a router's whole output); a static profile is a coefficient only."""
        correct = self.cache.values(indices)
        batch, length = correct[0][COEFFICIENT].shape[:2]
        if self.condition == "correct":
            intervened = correct
        elif self.condition == "cross_input":
            intervened = self.cache.values(self.donors[indices])
        elif self.condition == "token_shuffle":
            permutations = position_permutations(indices, length, self.seed)
            intervened = [dict(zip(value, shuffle_positions(list(value.values()), permutations))) for value in correct]
        else:
            slot_shapes = [tuple(s) for s in self.cache.manifest["slot_shapes"]]
            profile = broadcast_profile(self.profiles[self.condition], slot_shapes, batch, length)
            intervened = [{COEFFICIENT: c} for c in profile]
        return intervened if self.layer is None else restrict_to_layer(intervened, correct, self.layer)


def values_on(values: list[dict[str, torch.Tensor]], device, dtype) -> list[dict[str, torch.Tensor]]:
    """Values moved to ``device``, coefficients cast to the model's ``dtype`` (the rest of a controller's
    output keeps the dtype it was captured in, so replaying it is exact)."""
    return [
        {name: t.to(device=device, dtype=dtype if name == COEFFICIENT else t.dtype) for name, t in value.items()}
        for value in values
    ]
