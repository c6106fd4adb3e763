"""What a condition assigns: the coefficients (or a router's whole output) each eval window gets under it.

The one place that turns a condition (its function in ``results.conditions``), a coefficient cache and the
calibration profiles into replayed values;
the audit, the sweep, the mini-audit, the explorer and the dashboard all go through it.
"""

import functools
from collections.abc import Callable, Iterable, Sequence

import torch

from fca_workbench.adapters.placement import value_devices
from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel
from fca_workbench.audit.capture import CoefficientCache
from fca_workbench.audit.interventions import (
    ROUTER_TOP_K,
    broadcast_profile,
    causal_positions,
    derangement,
    position_permutations,
    profile_sums,
    profiles_from_sums,
    random_experts,
    restrict_to,
    routing_top_k,
    shuffle_positions,
    with_routing_profiles,
)
from fca_workbench.audit.lexical import (
    TOKEN_IDS,
    TokenPool,
    TokenSums,
    look_up,
    vocabulary,
    with_token_profile,
)
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import RANDOM_TOPK, Values, condition_named

Profiles = dict[str, list[torch.Tensor]]  # per profile name, one tensor per layer (``interventions.static_profiles``)
Total = Callable[[torch.Tensor], torch.Tensor]  # a sum over the processes that each read part of a set


def one_process(tensor: torch.Tensor) -> torch.Tensor:
    """The total of one process alone: its own sum."""
    return tensor


def calibration_profiles(
    cache: CoefficientCache, windows: torch.Tensor, shards: Iterable[int] | None = None, total: Total = one_process
) -> Profiles:
    """The static profiles of a calibration capture of token ids ``windows`` ``[N, T]``, plus ``layer_mean_topk``
    when it holds routers (their cached ``top_k_index`` gives k).

    ``shards``: only these shards are read; ``total``: adds a sum up over the processes that read the others
    (``distributed.Ranks.sum``), so every process gets the profiles of the whole calibration set."""
    batches = ((windows[indices], cache.coefficients(indices)) for indices in cache.shard_indices(shards))
    return profiles_of(batches, routing_top_k(cache.values(torch.arange(1))), vocabulary(windows), total)


def profiles_of(
    batches: Iterable[tuple[torch.Tensor, list[torch.Tensor]]],
    top_k: list[int | None],
    ids: torch.Tensor,
    total: Total = one_process,
) -> Profiles:
    """The static profiles of ``(token ids [B, T], per-layer coefficients)`` batches (``interventions.profile_sums``),
    with the routing profiles of the routers ``top_k`` names (``routing_top_k``) and the per-token profile over the
    token ids ``ids`` (``lexical.vocabulary`` of every window); ``total`` as in ``calibration_profiles``."""
    tokens = TokenSums(ids)
    sums, windows = profile_sums(tokens.seen(batches))
    totals = None if sums is None else [total(s) for s in sums]
    profiles = with_routing_profiles(profiles_from_sums(totals, int(total(torch.tensor(windows)))), top_k)
    return with_token_profile(profiles, ids, *tokens.totals(total), top_k)


def profile_of(condition: str, profiles: Profiles | None) -> list[torch.Tensor]:
    """A profile condition's per-layer profile; refused in one line when the calibration capture gave none."""
    if profiles is None or condition not in profiles:
        raise ValueError(f"condition '{condition}' needs its static profile from a calibration capture")
    return profiles[condition]


class WindowAssignment:
    """What a condition builds a batch's values from (``results.conditions.Assignment``): the windows' own cached
    values, a donor's (read when first asked for), their positions shuffled, the values at the same token in other
    windows (``same_token``: read when first asked for), or a calibration profile broadcast to every position or
    looked up by token id (``tokens``: the windows' token ids). ``own`` None: a text without cached values (a static
    condition applied to any text)."""

    def __init__(
        self,
        condition: str,
        own: Values | None,
        windows: torch.Tensor,
        seed: int,
        slot_shapes: Sequence[tuple[int, ...]],
        length: int,
        donor: Callable[[], Values] | None = None,
        profiles: Profiles | None = None,
        tokens: torch.Tensor | None = None,
        same_token: Callable[[], Values] | None = None,
    ) -> None:
        self.condition, self._own, self._windows, self.seed = condition, own, windows, seed
        self.slot_shapes, self.length, self._donor, self.profiles = slot_shapes, length, donor, profiles
        self._tokens, self._same_token = tokens, same_token

    @property
    def own(self) -> Values:
        if self._own is None:
            raise UserError(f"condition '{self.condition}' reads a text's own cached values: it is not static")
        return self._own

    @property
    def windows(self) -> torch.Tensor:
        return self._windows

    @property
    def tokens(self) -> torch.Tensor:
        if self._tokens is None:
            raise UserError(f"condition '{self.condition}' reads the token ids, which this replay was not given")
        return self._tokens[:, : self.length]

    def same_token(self) -> Values:
        if self._same_token is None:
            raise UserError(f"condition '{self.condition}' reads other windows' values: this replay has no eval set")
        return self._same_token()

    def donor(self) -> Values:
        if self._donor is None:
            raise UserError(f"condition '{self.condition}' reads a donor window's values: register it with uses_donor")
        length = self.length
        return [{name: t[:, :length] for name, t in value.items()} for value in self._donor()]  # a prefix: causal

    def shuffled(self, values: Values | None = None, *, causal: bool = False) -> Values:
        values = self.own if values is None else values
        choose = causal_positions if causal else position_permutations
        positions = choose(self.windows, self.length, self.seed)
        return [dict(zip(value, shuffle_positions(list(value.values()), positions))) for value in values]

    def profile(self, name: str) -> Values:
        profile = profile_of(name, self.profiles)
        shapes = self.slot_shapes
        return [{COEFFICIENT: c} for c in broadcast_profile(profile, shapes, len(self.windows), self.length)]

    def token_profile(self, name: str) -> Values:
        table, ids = profile_of(name, self.profiles), profile_of(TOKEN_IDS, self.profiles)
        return [{COEFFICIENT: c} for c in look_up(table, ids, self.tokens.cpu())]

    def random_experts(self) -> Values:
        template, top_k = profile_of(RANDOM_TOPK, self.profiles), profile_of(ROUTER_TOP_K, self.profiles)
        return [{COEFFICIENT: c} for c in random_experts(template, top_k, self.windows, self.length, self.seed)]


def assigned_values(
    condition: str,
    own: Values,
    donor: Callable[[], Values] | None,
    profiles: Profiles | None,
    slot_shapes: Sequence[tuple[int, ...]],
    window_indices: torch.Tensor,
    seed: int,
    controllers: Sequence[int] | None = None,
    tokens: torch.Tensor | None = None,
    pool: TokenPool | None = None,
) -> Values:
    """Per controller, the values ``condition`` assigns to windows ``window_indices`` (docs/concepts.md), at
    ``controllers`` only (indices; the other controllers keep their own) or everywhere (None): what its function builds from
    a ``WindowAssignment`` of the windows' cached values ``own`` ``[B, T, ...]``, ``donor`` (the donor windows'
    values, read when first asked for; a longer donor is cut to the windows' length: causal, so a prefix's values
    are its own), the calibration ``profiles``, the windows' token ids ``tokens`` ``[B, T]`` and the eval windows as
    ``same_token``'s donors (``pool``; a text that is no eval window has index -1 there). A value is checked against the windows' own (same controllers,
    same coefficient shape), so a registered condition's mistake is one line, not a failure inside the model."""
    named = condition_named(condition)
    if named.assign is None:
        raise ValueError(f"'{condition}' is the live run: nothing is replayed (its NLL is the cache's)")
    length = own[0][COEFFICIENT].shape[1]
    same_token = None
    if pool is not None and tokens is not None:
        same_token = functools.partial(pool.values, own, tokens[:, :length].cpu(), window_indices, seed)
    assignment = WindowAssignment(
        condition, own, window_indices.clamp(min=0), seed, slot_shapes, length, donor, profiles, tokens, same_token
    )
    intervened = checked(condition, named.assign(assignment), own)
    return intervened if controllers is None else restrict_to(intervened, own, controllers)


def checked(condition: str, values: Values, like: Values) -> Values:
    """``values`` when they have the controllers and coefficient shapes of ``like``, else one line."""
    if not isinstance(values, list) or len(values) != len(like):
        raise UserError(f"condition '{condition}' must return one value per controller ({len(like)})")
    for index, (value, own) in enumerate(zip(values, like)):
        coefficient = value.get(COEFFICIENT) if isinstance(value, dict) else None
        expected = own[COEFFICIENT].shape
        if not isinstance(coefficient, torch.Tensor) or coefficient.shape != expected:
            found = getattr(coefficient, "shape", type(coefficient).__name__)
            raise UserError(
                f"condition '{condition}' gave controller {index} a coefficient of {found}, expected {tuple(expected)}"
            )
    return values


def static_values(
    condition: str,
    profiles: Profiles | None,
    slot_shapes: Sequence[tuple[int, ...]],
    batch: int,
    length: int,
    tokens: torch.Tensor | None = None,
) -> Values:
    """Per controller, what a static condition assigns to any ``batch`` texts of ``length`` tokens (their token ids
    ``tokens`` ``[batch, length]``, for a per-token profile): built from the calibration profiles alone, a
    coefficient only (no cache is needed: ``fca eval`` replays it on a task's texts, ``fca export`` folds one that is
    the same for every text into the weights)."""
    named = condition_named(condition)
    if not named.static or named.assign is None:
        raise UserError(f"'{condition}' needs a text's own cached values; only static profiles apply to any text")
    windows = torch.zeros(batch, dtype=torch.long)
    like = [{COEFFICIENT: torch.empty(batch, length, *shape)} for shape in slot_shapes]
    assignment = WindowAssignment(condition, None, windows, 0, slot_shapes, length, None, profiles, tokens)
    return [{COEFFICIENT: v[COEFFICIENT]} for v in checked(condition, named.assign(assignment), like)]


def static_profile_values(
    condition: str, profiles: Profiles | None, slot_shapes: Sequence[tuple[int, ...]]
) -> list[torch.Tensor]:
    """Per controller, the ``[*slot]`` coefficients an exportable static condition assigns at every position:
    what ``fca export`` folds into one weight set."""
    named = condition_named(condition)
    if not named.exportable:
        raise UserError(f"'{condition}' {named.not_exportable}: no single weight set holds it")
    return [value[COEFFICIENT][0, 0] for value in static_values(condition, profiles, slot_shapes, 1, 1)]


class ConditionCoefficients:
    """The values a condition assigns to any batch of eval windows, read from a coefficient cache; ``tokens``: the
    eval windows' token ids ``[N, T]`` (a per-token profile looks them up, ``same_token`` draws donors among them).

    The seeded cross-input derangement is fixed once per condition, and ``same_token``'s donors are seeded per
    window, so a window gets the same values however the windows are batched.
    """

    def __init__(
        self,
        condition: str,
        cache: CoefficientCache,
        profiles: Profiles | None = None,
        seed: int = 0,
        controllers: Sequence[int] | None = None,
        tokens: torch.Tensor | None = None,
    ) -> None:
        named = condition_named(condition)
        if named.static and profiles is None:
            raise ValueError(f"condition '{condition}' needs its static profile from a calibration capture")
        if named.live:
            raise ValueError(f"'{condition}' is the live run: nothing is replayed (its NLL is the cache's)")
        self.condition, self.cache, self.profiles, self.seed = condition, cache, profiles, seed
        self.controllers = controllers
        self.donors = derangement(cache.num_windows, seed) if named.needs_donor else None
        self.slot_shapes = [tuple(s) for s in cache.manifest["slot_shapes"]]
        self.tokens = tokens
        self.pool = None if tokens is None else TokenPool(tokens, cache.values, cache.shard_size)

    def __call__(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the coefficients ``[B, T, *slot]`` the condition assigns."""
        return [value[COEFFICIENT] for value in self.values(indices)]

    def values(self, indices: torch.Tensor) -> Values:
        """Per controller, the values replayed (``assigned_values``)."""
        donors = self.donors
        donor = None if donors is None else functools.partial(self.cache.values, donors[indices])
        return assigned_values(
            self.condition,
            self.cache.values(indices),
            donor,
            self.profiles,
            self.slot_shapes,
            indices,
            self.seed,
            self.controllers,
            None if self.tokens is None else self.tokens[indices],
            self.pool,
        )


def placed(model: ControlledModel, values: Values, device: torch.device | str) -> Values:
    """``values`` where the model replays them: each controller's on its own device (``placement.value_devices``:
    ``device``, or where big-model inference put that controller) and its coefficient in that controller's dtype
    (``coefficient_dtypes``: a router's float32 gate in a bfloat16 model too). Every replay places values here."""
    return values_on(values, value_devices(model, device), model.coefficient_dtypes)


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
