"""What a condition assigns: the coefficients (or a router's whole output) each eval window gets under it.

The one place that turns a condition (what ``results.conditions`` says it assigns), a coefficient cache and the calibration profiles into replayed values;
the audit, the sweep, the mini-audit, the explorer and the dashboard all go through it.
"""

from collections.abc import Callable, Iterable, Sequence

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
from fca_workbench.results.conditions import (
    CACHED_RUN,
    DONOR_VALUES,
    OWN_VALUES,
    SHUFFLED_POSITIONS,
    STATIC_PROFILE,
    condition_named,
)

Values = list[dict[str, torch.Tensor]]  # per controller, its cached outputs by name (``COEFFICIENT`` first)
Profiles = dict[str, list[torch.Tensor]]  # per profile name, one tensor per layer (``interventions.static_profiles``)
Total = Callable[[torch.Tensor], torch.Tensor]  # a sum over the processes that each read part of a set


def one_process(tensor: torch.Tensor) -> torch.Tensor:
    """The total of one process alone: its own sum."""
    return tensor


def calibration_profiles(
    cache: CoefficientCache, shards: Iterable[int] | None = None, total: Total = one_process
) -> Profiles:
    """The static profiles of a calibration capture, plus ``layer_mean_topk`` when it holds routers (their
    cached ``top_k_index`` gives k).

    ``shards``: only these shards are read; ``total``: adds a sum up over the processes that read the others
    (``distributed.Ranks.sum``), so every process gets the profiles of the whole calibration set."""
    return profiles_of(cache.batches(shards), routing_top_k(cache.values(torch.arange(1))), total)


def profiles_of(batches: Iterable[list[torch.Tensor]], top_k: list[int | None], total: Total = one_process) -> Profiles:
    """The static profiles of per-layer coefficient batches (``interventions.profile_sums``), with the routing
    profiles of the routers ``top_k`` names (``routing_top_k``); ``total`` as in ``calibration_profiles``."""
    sums, windows = profile_sums(batches)
    totals = None if sums is None else [total(s) for s in sums]
    profiles = profiles_from_sums(totals, int(total(torch.tensor(windows))))
    return with_routing_profiles(profiles, top_k)


def profile_of(condition: str, profiles: Profiles | None) -> list[torch.Tensor]:
    """A profile condition's per-layer profile; refused in one line when the calibration capture gave none."""
    if profiles is None or condition not in profiles:
        raise ValueError(f"condition '{condition}' needs its static profile from a calibration capture")
    return profiles[condition]


def assigned_values(
    condition: str,
    own: Values,
    donor: Values | None,
    profiles: Profiles | None,
    slot_shapes: Sequence[tuple[int, ...]],
    window_indices: torch.Tensor,
    seed: int,
    layer: int | None = None,
) -> Values:
    """Per controller, the values ``condition`` assigns to windows ``window_indices`` (docs/concepts.md),
    at ``layer`` only (the other layers keep their own) or everywhere (``layer`` None).

    ``own``: the windows' cached values ``[B, T, ...]``; ``donor``: the donor windows' (``cross_input`` only;
    a longer donor is cut to the windows' length: causal, so a prefix's values are its own); ``profiles``:
    the calibration profiles (profile conditions only). The baselines, ``cross_input`` and ``token_shuffle``
    move everything cached (a router's whole output); a static profile is a coefficient only. Seeded choices
    depend on (seed, window index) alone, so a window gets the same values however windows are batched."""
    batch, length = own[0][COEFFICIENT].shape[:2]
    assignment = condition_named(condition).assignment
    if assignment in (CACHED_RUN, OWN_VALUES):
        return own
    if assignment == DONOR_VALUES:
        if donor is None:
            raise ValueError(f"{condition} needs the donor windows' values")
        intervened = [{name: t[:, :length] for name, t in value.items()} for value in donor]
    elif assignment == SHUFFLED_POSITIONS:
        permutations = position_permutations(window_indices, length, seed)
        intervened = [dict(zip(value, shuffle_positions(list(value.values()), permutations))) for value in own]
    elif assignment == STATIC_PROFILE:
        intervened = static_values(condition, profiles, slot_shapes, batch, length)
    else:
        raise ValueError(f"condition '{condition}' assigns '{assignment}', which replay does not know")
    return intervened if layer is None else restrict_to_layer(intervened, own, layer)


def static_values(
    condition: str, profiles: Profiles | None, slot_shapes: Sequence[tuple[int, ...]], batch: int, length: int
) -> Values:
    """Per controller, what a profile condition assigns to any ``batch`` texts of ``length`` tokens: its profile
    broadcast to every position, a coefficient only (the same for every text, so no cache is needed: ``fca
    eval`` replays it on a task's texts)."""
    profile = profile_of(condition, profiles)
    return [{COEFFICIENT: c} for c in broadcast_profile(profile, slot_shapes, batch, length)]


class ConditionCoefficients:
    """The values a condition assigns to any batch of eval windows, read from a coefficient cache.

    The seeded cross-input derangement is fixed once per condition, so a window gets the same values however
    the windows are batched.
    """

    def __init__(
        self,
        condition: str,
        cache: CoefficientCache,
        profiles: Profiles | None = None,
        seed: int = 0,
        layer: int | None = None,
    ) -> None:
        named = condition_named(condition)
        if named.static:
            profile_of(condition, profiles)  # refused here, before any window is read
        if named.live:
            raise ValueError(f"'{condition}' is the live run: nothing is replayed (its NLL is the cache's)")
        self.condition, self.cache, self.profiles, self.seed, self.layer = condition, cache, profiles, seed, layer
        self.donors = derangement(cache.num_windows, seed) if named.needs_donor else None
        self.slot_shapes = [tuple(s) for s in cache.manifest["slot_shapes"]]

    def __call__(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the coefficients ``[B, T, *slot]`` the condition assigns."""
        return [value[COEFFICIENT] for value in self.values(indices)]

    def values(self, indices: torch.Tensor) -> Values:
        """Per controller, the values replayed (``assigned_values``)."""
        donor = self.cache.values(self.donors[indices]) if self.donors is not None else None
        own = self.cache.values(indices)
        return assigned_values(
            self.condition, own, donor, self.profiles, self.slot_shapes, indices, self.seed, self.layer
        )


def values_on(
    values: Values,
    device: torch.device | str | Sequence[torch.device],
    dtype: torch.dtype | Sequence[torch.dtype],
) -> Values:
    """Values moved to ``device`` (or, a sequence, each controller's to its own: ``placement.value_devices``),
    coefficients cast to ``dtype`` (or, a sequence, each to its controller's: ``coefficient_dtypes``, a router's
    float32 gate in a bfloat16 model too); the rest of a controller's output keeps the dtype it was captured in,
    so replaying it is exact."""
    devices = [device] * len(values) if isinstance(device, (str, torch.device)) else device
    dtypes = [dtype] * len(values) if isinstance(dtype, torch.dtype) else dtype
    return [
        {name: t.to(device=where, dtype=cast if name == COEFFICIENT else t.dtype) for name, t in value.items()}
        for value, where, cast in zip(values, devices, dtypes)
    ]
