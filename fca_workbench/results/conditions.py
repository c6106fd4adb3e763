"""The condition vocabulary: every condition an audit replays, as data that carries its behaviour
(docs/concepts.md).

Names are part of the interface: ``audit.json`` (its schema's enums are filled from here), the per-token files,
the tables, the dashboard and the CLI all use these, and only these, spellings. Code asks a ``Condition`` what it
is (``live``, ``assignment``, ``retention_end``, ...) and never compares its name; a figure of one named
condition is read through the names below (``CORRECT``, ``GLOBAL_MEAN``, ...). Every collection of condition
names the workbench needs is derived from ``VOCABULARY``; nothing else spells two names together.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from fca_workbench.foundation.errors import UserError

LIVE, OWN, REASSIGNMENT, PROFILE = "live", "own", "reassignment", "profile"

# what a condition assigns to a window (``audit.assignment.assigned_values`` dispatches on it)
CACHED_RUN = "cached_run"  # nothing replayed: the live run's cached NLL and coefficients
OWN_VALUES = "own_values"  # the window's own cached values, replayed with the controller off
DONOR_VALUES = "donor_values"  # another window's cached values (a seeded derangement, or a donor picked)
SHUFFLED_POSITIONS = "shuffled_positions"  # the window's own values, positions permuted by a seeded permutation
STATIC_PROFILE = "static_profile"  # the calibration profile of the condition's own name, at every position

TOP, BOTTOM = "top", "bottom"  # the two ends of the gap a retention is over (``retention_end``)


@dataclass(frozen=True)
class Condition:
    """One condition: what it is called, what it assigns (``help``, ``assignment``) and how the workbench
    treats it.

    ``kind``: ``live`` (the controller running), ``own`` (each window's cached values), ``reassignment`` (cached
    values moved between windows or positions, by a seed) or ``profile`` (a static profile of the calibration
    set). ``routers_only``: replayed only for models whose controllers are top-k routers. ``retention``: its gap
    retention is reported. ``retention_end``: ``top`` for the reference the gap starts at (retention 1),
    ``bottom`` for its low end (retention 0). ``headline``: shown first where a summary has room for a few
    (over-seed report, training-dynamics table). ``per_position``: a profile that differs by position."""

    name: str
    help: str
    kind: str
    assignment: str
    routers_only: bool = False
    retention: bool = False
    retention_end: str | None = None
    headline: bool = False
    per_position: bool = False  # a profile that differs by position: no static model has it (``fca export``)

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
        return self.assignment == DONOR_VALUES

    @property
    def static(self) -> bool:
        """Whether it needs a static profile of the calibration set (and no text's own cached values)."""
        return self.kind == PROFILE


# the names, each spelled once
UNPERTURBED = "unperturbed"
CORRECT = "correct"
CROSS_INPUT = "cross_input"
TOKEN_SHUFFLE = "token_shuffle"
GLOBAL_MEAN = "global_mean"
LAYER_SCALAR = "layer_scalar"
LAYER_MEAN = "layer_mean"
LAYER_POSITION_MEAN = "layer_position_mean"
LAYER_MEAN_TOPK = "layer_mean_topk"

VOCABULARY = (
    Condition(UNPERTURBED, "the live model, controller running", LIVE, CACHED_RUN),
    Condition(
        CORRECT,
        "the window's own coefficients, replayed with the controller off",
        OWN,
        OWN_VALUES,
        retention_end=TOP,
    ),
    Condition(
        CROSS_INPUT,
        "another eval window's coefficients (donor: seeded derangement, or the donor you pick)",
        REASSIGNMENT,
        DONOR_VALUES,
        headline=True,
    ),
    Condition(
        TOKEN_SHUFFLE,
        "the window's own coefficients, positions permuted by one seeded permutation",
        REASSIGNMENT,
        SHUFFLED_POSITIONS,
        headline=True,
    ),
    Condition(
        GLOBAL_MEAN,
        "one scalar: the mean of every coefficient over the calibration set",
        PROFILE,
        STATIC_PROFILE,
        retention_end=BOTTOM,
        headline=True,
    ),
    Condition(LAYER_SCALAR, "one scalar per layer (calibration mean)", PROFILE, STATIC_PROFILE, retention=True),
    Condition(
        LAYER_MEAN,
        "the static layerwise profile: per layer and slot (calibration mean)",
        PROFILE,
        STATIC_PROFILE,
        retention=True,
        headline=True,
    ),
    Condition(
        LAYER_POSITION_MEAN,
        "per layer, slot and position (calibration mean)",
        PROFILE,
        STATIC_PROFILE,
        retention=True,
        per_position=True,
    ),
    Condition(
        LAYER_MEAN_TOPK,
        "routers: each layer's k experts with the largest mean gate, for every token (calibration)",
        PROFILE,
        STATIC_PROFILE,
        routers_only=True,
        retention=True,
    ),
)

BY_NAME = {c.name: c for c in VOCABULARY}
LIVE_RUN = next(c.name for c in VOCABULARY if c.live)  # the run every capture caches
REFERENCE = next(c.name for c in VOCABULARY if c.retention_end == TOP)  # a gap's top end, ΔNLL's reference
LOW = next(c.name for c in VOCABULARY if c.retention_end == BOTTOM)  # a gap's bottom end (retention 0)

ALL_CONDITIONS = tuple(c.name for c in VOCABULARY)  # every name audit.json may hold, in report order
CONDITIONS = tuple(c.name for c in VOCABULARY if not c.routers_only)  # section 4's: every model with a controller
ROUTING_CONDITIONS = tuple(c.name for c in VOCABULARY if c.routers_only)  # added for models with top-k routers
BASELINES = tuple(c.name for c in VOCABULARY if c.baseline)  # a window's own values: no intervention
INTERVENTIONS = tuple(c.name for c in VOCABULARY if c.intervention)  # what the sweep replays
REASSIGNMENTS = tuple(c.name for c in VOCABULARY if c.kind == REASSIGNMENT)
SEEDED = tuple(c.name for c in VOCABULARY if c.seeded)
PROFILE_CONDITIONS = tuple(c.name for c in VOCABULARY if c.static)  # need calibration profiles
EXPORTABLE_PROFILES = tuple(c.name for c in VOCABULARY if c.static and not c.per_position)  # one weight set
STATIC_PROFILES = tuple(c for c in PROFILE_CONDITIONS if c in CONDITIONS)  # the profiles every controller has
# gap retention in report order: the headline profile (the static layerwise one) first, then the others
RETAINED = tuple(c.name for c in sorted((c for c in VOCABULARY if c.retention), key=lambda c: not c.headline))
RETENTION_PROFILES = tuple(p for p in RETAINED if p in CONDITIONS)  # the retention every audit with a controller has
HEADLINE_CONDITIONS = tuple(c.name for c in VOCABULARY if c.headline)
CONDITION_HELP = {c.name: c.help for c in VOCABULARY}


def condition_named(name: str) -> Condition:
    """The condition called ``name``; any other name is one line."""
    if name not in BY_NAME:
        raise UserError(f"unknown condition '{name}'; choose from {', '.join(ALL_CONDITIONS)}")
    return BY_NAME[name]


def model_conditions(routed: bool) -> tuple[str, ...]:
    """Every condition a model with a controller replays: section 4's, and the routing ones when ``routed``
    (some controller is a top-k router)."""
    return CONDITIONS + (ROUTING_CONDITIONS if routed else ())


def retention_profiles(conditions: Iterable[str]) -> tuple[str, ...]:
    """The profiles whose gap retention is reported for a model that replays ``conditions``."""
    return tuple(p for p in RETAINED if p in conditions)


def conditions_epilog() -> str:
    """The conditions and what each assigns, as ``fca audit --help`` lists them."""
    width = max(len(name) for name in ALL_CONDITIONS)
    return "conditions (audit.json 'conditions'):\n" + "\n".join(f"  {c.name:{width}s}  {c.help}" for c in VOCABULARY)
