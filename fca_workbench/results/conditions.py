"""The condition registry: every condition an audit replays, as objects that assign (docs/concepts.md).

A condition is a name, its role in the figures and a function that builds the values a batch of eval windows
gets from what an ``Assignment`` offers: the windows' own cached values, a donor window's, their positions
shuffled, or a static profile of the calibration set. The built-in ones are declared below, once; a user adds
one with ``register_condition`` (from Python, or from a package's ``fca_workbench_conditions`` entry point), and
it then runs through the audit, the sweep, the explorer, the dashboard, ``fca eval`` and ``fca export`` like a
built-in one, written to ``audit.json`` under its name.

Names are part of the interface: ``audit.json``, the per-token files, the tables, the dashboard and the CLI use
these spellings. Code asks a ``Condition`` what it is (``live``, ``static``, ``retention_end``, ...) and never
compares its name; a figure of one named condition is read through the names below (``CORRECT``,
``GLOBAL_MEAN``, ...). No torch here: the functions only call what an ``Assignment`` offers, so ``fca --help``
lists the conditions without importing it.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from fca_workbench.foundation.errors import UserError

if TYPE_CHECKING:
    import torch

Values = list[dict[str, "torch.Tensor"]]  # per controller, its outputs by name (the coefficient first), [B, T, ...]

LIVE, OWN, REASSIGNMENT, PROFILE = "live", "own", "reassignment", "profile"
USER_KINDS = (REASSIGNMENT, PROFILE)  # what a registered condition may be: the live run and its replay are built in
TOP, BOTTOM = "top", "bottom"  # the two ends of the gap a retention is over (``retention_end``)
ENTRY_POINT_GROUP = "fca_workbench_conditions"  # a package's conditions, registered when the registry is first read
NAME_PATTERN = r"[a-z][a-z0-9_]{0,47}"  # a condition's name: a column, a file field and a flag value alike


class Assignment(Protocol):
    """What a condition builds its values from, for one batch of eval windows (``audit.assignment`` implements
    it). Every value is per controller, its outputs by name (``coefficient`` first), ``[B, T, ...]``; seeded
    choices depend on (``seed``, window index) alone, so a window gets the same values however it is batched."""

    seed: int

    @property
    def own(self) -> Values:
        """The windows' own cached values (a static condition, applied to any text, has none)."""
        ...

    @property
    def windows(self) -> torch.Tensor:
        """The eval windows' indices ``[B]``."""
        ...

    @property
    def tokens(self) -> torch.Tensor:
        """The windows' token ids ``[B, T]``."""
        ...

    def donor(self) -> Values:
        """Another eval window's cached values: the audit's seeded derangement, or the donor the user picked."""
        ...

    def shuffled(self, values: Values | None = None, *, causal: bool = False) -> Values:
        """``values`` (default: the own ones) with positions permuted by one seeded permutation per window, the
        same at every controller; ``causal``: position t gets a random position at or before it instead."""
        ...

    def same_token(self) -> Values:
        """Per position, the values another eval window computed at a position holding the same token id (a donor
        drawn uniformly among them, seeded by window); a position whose token no other window holds keeps its own."""
        ...

    def profile(self, name: str) -> Values:
        """The calibration set's static profile ``name`` at every position: a coefficient only."""
        ...

    def token_profile(self, name: str) -> Values:
        """The calibration set's per-token profile ``name`` looked up at each position's token id: a coefficient."""
        ...

    def random_experts(self) -> Values:
        """Per router, k of its E experts drawn uniformly at random per window and router (seeded), each at an equal
        share of the routed mass, at every position; a controller that routes to no experts its ``layer_mean``."""
        ...


Assign = Callable[[Assignment], Values]


@dataclass(frozen=True)
class Condition:
    """One condition: its name, what it assigns (``help``, ``assign``) and how the workbench treats it.

    ``kind``: ``live`` (the controller running; ``assign`` None: nothing is replayed), ``own`` (each window's
    cached values), ``reassignment`` (cached values moved between windows or positions, by a seed) or ``profile``
    (built from static profiles of the calibration set only, so it applies to any text). ``uses_donor``: it reads
    ``Assignment.donor`` (the dashboard then offers a donor). ``uses_same_token``: it reads ``Assignment.same_token``
    (the audit records how many eval positions kept their own values, their token being in no other window).
    ``routers_only``: replayed only for models whose
    controllers are top-k routers. ``retention``: its gap retention is reported. ``retention_end``: ``top`` for the
    reference the gap starts at (retention 1), ``bottom`` for its low end (retention 0). ``headline``: shown first
    where a summary has room for a few. ``per_position``: a profile that differs by position (no static model has
    it). ``per_token``: a profile looked up by each position's token id (a table, not one weight set). ``built_in``:
    declared here rather than registered by a user. ``reference``: the condition at the low end of
    its retention's gap when that is not ``LOW`` (a router's top-k profile: the compute-matched ``random_topk``)."""

    name: str
    help: str
    kind: str
    assign: Assign | None
    uses_donor: bool = False
    routers_only: bool = False
    retention: bool = False
    retention_end: str | None = None
    headline: bool = False
    per_position: bool = False
    built_in: bool = False
    reference: str | None = None
    uses_same_token: bool = False
    per_token: bool = False

    def __str__(self) -> str:
        return self.name

    @property
    def live(self) -> bool:
        """Whether it is the live run itself (nothing replayed: its NLL is the one capture cached)."""
        return self.kind == LIVE

    @property
    def baseline(self) -> bool:
        """Whether a window keeps its own values: no intervention (the live run, or its frozen replay)."""
        return self.kind in (LIVE, OWN)

    @property
    def intervention(self) -> bool:
        """Whether it reassigns or replaces the cached values (what the per-layer sweep replays)."""
        return self.kind in (REASSIGNMENT, PROFILE)

    @property
    def seeded(self) -> bool:
        """Whether the seed changes what it assigns (the cross-input derangement, the position shuffles)."""
        return self.kind == REASSIGNMENT

    @property
    def needs_donor(self) -> bool:
        """Whether it replays another window's values (so a donor window must be read or chosen)."""
        return self.uses_donor

    @property
    def static(self) -> bool:
        """Whether it is built from static profiles of the calibration set alone (no text's own cached values)."""
        return self.kind == PROFILE

    @property
    def exportable(self) -> bool:
        """Whether one weight set holds it (``fca export``): static, the same at every position and for every token."""
        return self.static and not self.per_position and not self.per_token

    @property
    def not_exportable(self) -> str:
        """Why ``fca export`` cannot fold it into one weight set (empty: it can)."""
        if self.static and self.per_token:
            return "is a lookup by token id (a router's: token → experts), which no plain transformers checkpoint holds"
        return "" if self.exportable else "depends on the position or the text; a static model has one set of weights"


def own_values(assignment: Assignment) -> Values:
    return assignment.own


def donor_values(assignment: Assignment) -> Values:
    return assignment.donor()


def shuffled_positions(assignment: Assignment) -> Values:
    return assignment.shuffled()


def causally_shuffled_positions(assignment: Assignment) -> Values:
    return assignment.shuffled(causal=True)


def same_token_values(assignment: Assignment) -> Values:
    return assignment.same_token()


def random_experts(assignment: Assignment) -> Values:
    return assignment.random_experts()


def token_means(assignment: Assignment) -> Values:
    return assignment.token_profile(LAYER_TOKEN_MEAN)


def static_profile(name: str) -> Assign:
    """The assignment of the built-in profile ``name``: that profile of the calibration set, everywhere."""

    def assign(assignment: Assignment) -> Values:
        return assignment.profile(name)

    assign.__name__ = assign.__qualname__ = f"static_profile_{name}"
    return assign


# the names, each spelled once
UNPERTURBED = "unperturbed"
CORRECT = "correct"
CROSS_INPUT = "cross_input"
SAME_TOKEN = "same_token"
TOKEN_SHUFFLE = "token_shuffle"
CAUSAL_SHUFFLE = "causal_shuffle"
GLOBAL_MEAN = "global_mean"
LAYER_SCALAR = "layer_scalar"
LAYER_MEAN = "layer_mean"
LAYER_POSITION_MEAN = "layer_position_mean"
LAYER_MEAN_TOPK = "layer_mean_topk"
RANDOM_TOPK = "random_topk"
LAYER_TOKEN_MEAN = "layer_token_mean"

VOCABULARY = tuple(  # the built-in conditions, in report order
    replace(c, built_in=True)
    for c in (
        Condition(UNPERTURBED, "the live model, controller running", LIVE, None),
        Condition(
            CORRECT,
            "the window's own coefficients, replayed with the controller off",
            OWN,
            own_values,
            retention_end=TOP,
        ),
        Condition(
            CROSS_INPUT,
            "another eval window's coefficients (donor: seeded derangement, or the donor you pick)",
            REASSIGNMENT,
            donor_values,
            uses_donor=True,
            headline=True,
        ),
        Condition(
            SAME_TOKEN,
            "per position, the coefficients another eval window computed at a position holding the same token id"
            " (seeded); a token no other window holds keeps its own",
            REASSIGNMENT,
            same_token_values,
            headline=True,
            uses_same_token=True,
        ),
        Condition(
            TOKEN_SHUFFLE,
            "the window's own coefficients, positions permuted by one seeded permutation",
            REASSIGNMENT,
            shuffled_positions,
            headline=True,
        ),
        Condition(
            CAUSAL_SHUFFLE,
            "the window's own coefficients, each position given a seeded random position at or before it",
            REASSIGNMENT,
            causally_shuffled_positions,
            headline=True,
        ),
        Condition(
            GLOBAL_MEAN,
            "one scalar: the mean of every coefficient over the calibration set",
            PROFILE,
            static_profile(GLOBAL_MEAN),
            retention_end=BOTTOM,
            headline=True,
        ),
        Condition(
            LAYER_SCALAR,
            "one scalar per layer (calibration mean)",
            PROFILE,
            static_profile(LAYER_SCALAR),
            retention=True,
        ),
        Condition(
            LAYER_MEAN,
            "the static layerwise profile: per layer and slot (calibration mean)",
            PROFILE,
            static_profile(LAYER_MEAN),
            retention=True,
            headline=True,
        ),
        Condition(
            LAYER_POSITION_MEAN,
            "per layer, slot and position (calibration mean)",
            PROFILE,
            static_profile(LAYER_POSITION_MEAN),
            retention=True,
            per_position=True,
        ),
        Condition(
            LAYER_MEAN_TOPK,
            "routers: each layer's k experts with the largest mean gate, for every token (calibration)",
            PROFILE,
            static_profile(LAYER_MEAN_TOPK),
            routers_only=True,
            retention=True,
            reference=RANDOM_TOPK,
        ),
        Condition(
            RANDOM_TOPK,
            "routers: k experts per token drawn at random per window and layer (seeded), equal weights: the routed"
            " compute without the router's choice (layer_mean_topk's retention reference)",
            PROFILE,
            random_experts,
            routers_only=True,
        ),
        Condition(
            LAYER_TOKEN_MEAN,
            "per layer, slot and token id (calibration mean, shrunk toward layer_mean for rare tokens; routers: its"
            " top k experts): a lookup by the current token",
            PROFILE,
            token_means,
            retention=True,
            reference=RANDOM_TOPK,
            per_token=True,
        ),
    )
)

LIVE_RUN = next(c.name for c in VOCABULARY if c.live)  # the run every capture caches
REFERENCE = next(c.name for c in VOCABULARY if c.retention_end == TOP)  # a gap's top end, ΔNLL's reference
LOW = next(c.name for c in VOCABULARY if c.retention_end == BOTTOM)  # a gap's bottom end (retention 0)

# The built-in conditions' names by role: what the paper's tables and figures show (a registered condition is in
# the registry's listings below, and in every audit.json it was replayed in).
ALL_CONDITIONS = tuple(c.name for c in VOCABULARY)
CONDITIONS = tuple(c.name for c in VOCABULARY if not c.routers_only)  # section 4's: every model with a controller
BASELINES = tuple(c.name for c in VOCABULARY if c.baseline)  # a window's own values: no intervention
ROUTING_CONDITIONS = tuple(c.name for c in VOCABULARY if c.routers_only)  # added for models with top-k routers
REASSIGNMENTS = tuple(c.name for c in VOCABULARY if c.kind == REASSIGNMENT)
STATIC_PROFILES = tuple(c.name for c in VOCABULARY if c.static and not c.routers_only)  # every controller has them
# gap retention in report order: the headline profile (the static layerwise one) first, then the others
RETAINED = tuple(c.name for c in sorted((c for c in VOCABULARY if c.retention), key=lambda c: not c.headline))
RETENTION_PROFILES = tuple(p for p in RETAINED if p in CONDITIONS)  # the retention every audit with a controller has
HEADLINE_CONDITIONS = tuple(c.name for c in VOCABULARY if c.headline)

_registry: dict[str, Condition] = {c.name: c for c in VOCABULARY}
_lock = threading.Lock()
_entry_points_loaded = False


def register_condition(condition: Condition) -> Condition:
    """Add a user's condition to the registry: every surface replays and lists it from then on (in this process;
    a package's ``fca_workbench_conditions`` entry point registers it in every process, the CLI's and the
    dashboard's too). Its name, kind and function are checked here, in one line; registering the same condition
    again is harmless."""
    if not re.fullmatch(NAME_PATTERN, condition.name):
        raise UserError(f"condition name {condition.name!r} must match {NAME_PATTERN} (it becomes a column name)")
    if condition.kind not in USER_KINDS:
        raise UserError(f"condition '{condition.name}': kind must be one of {', '.join(USER_KINDS)}")
    if not callable(condition.assign):
        raise UserError(f"condition '{condition.name}': assign must be a function of an Assignment")
    if condition.retention_end is not None or condition.built_in:
        raise UserError(f"condition '{condition.name}': the ends of the gap are the built-in {REFERENCE} and {LOW}")
    with _lock:
        known = _registry.get(condition.name)
        if known is not None and known != condition:
            raise UserError(f"a different condition '{condition.name}' is already registered")
        _registry[condition.name] = condition
    return condition


def condition(
    name: str,
    help: str,
    kind: str = REASSIGNMENT,
    *,
    uses_donor: bool = False,
    retention: bool = False,
    routers_only: bool = False,
    per_position: bool = False,
) -> Callable[[Assign], Assign]:
    """``register_condition`` as a decorator of the function that assigns."""

    def register(assign: Assign) -> Assign:
        register_condition(
            Condition(name, help, kind, assign, uses_donor, routers_only, retention, per_position=per_position)
        )
        return assign

    return register


def unregister_condition(name: str) -> None:
    """Remove a registered condition (a notebook redefining one); the built-in ones stay."""
    with _lock:
        if name in _registry and not _registry[name].built_in:
            del _registry[name]


def registered() -> tuple[Condition, ...]:
    """Every condition, the built-in ones first, then the registered ones in the order they came (the entry points'
    are loaded the first time, so a plugin package's conditions are there in every process)."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            loaded = entry.load()  # a Condition, or a module that registers its conditions when imported
            for found in loaded if isinstance(loaded, (list, tuple)) else [loaded]:
                if isinstance(found, Condition):
                    register_condition(found)
    with _lock:
        return tuple(_registry.values())


def condition_named(name: str) -> Condition:
    """The condition called ``name``; any other name is one line."""
    found = {c.name: c for c in registered()}
    if name not in found:
        raise UserError(f"unknown condition '{name}'; choose from {', '.join(found)}")
    return found[name]


def condition_names(keep: Callable[[Condition], bool] = lambda c: True) -> tuple[str, ...]:
    """The names of the registered conditions ``keep`` holds for, in report order."""
    return tuple(c.name for c in registered() if keep(c))


def model_conditions(routed: bool) -> tuple[str, ...]:
    """Every condition a model with a controller replays: every registered one, the routing ones only when
    ``routed`` (some controller is a top-k router)."""
    return condition_names(lambda c: routed or not c.routers_only)


def retention_profiles(conditions: Iterable[str]) -> tuple[str, ...]:
    """The profiles whose gap retention is reported for a model that replays ``conditions``: the headline one
    first, then the others in report order."""
    retained = sorted((c for c in registered() if c.retention), key=lambda c: not c.headline)
    return tuple(c.name for c in retained if c.name in conditions)


def conditions_epilog() -> str:
    """The conditions and what each assigns, as ``fca audit --help`` lists them."""
    conditions = registered()
    width = max(len(c.name) for c in conditions)
    lines = [f"  {c.name:{width}s}  {c.help}" for c in conditions]
    return "conditions (audit.json 'conditions'):\n" + "\n".join(lines)
