"""The condition vocabulary: every condition an audit replays, as data (docs/concepts.md).

Names are part of the interface: ``audit.json`` (its schema's enums are filled from here), the per-token files,
the tables, the dashboard and the CLI all use these, and only these, spellings. Every collection of condition
names the workbench needs is derived below from ``VOCABULARY``; nothing else spells two names together.
"""

from collections.abc import Iterable
from dataclasses import dataclass

LIVE, OWN, REASSIGNMENT, PROFILE = "live", "own", "reassignment", "profile"


@dataclass(frozen=True)
class Condition:
    """One condition: what it is called, what it assigns (``help``) and how the workbench treats it.

    ``kind``: ``live`` (the controller running), ``own`` (each window's cached values), ``reassignment`` (cached
    values moved between windows or positions, by a seed) or ``profile`` (a static profile of the calibration
    set). ``routers_only``: replayed only for models whose controllers are top-k routers. ``retention``: its gap
    retention is reported. ``headline``: shown first where a summary has room for a few (over-seed report,
    training-dynamics table)."""

    name: str
    help: str
    kind: str
    routers_only: bool = False
    retention: bool = False
    headline: bool = False

    @property
    def seeded(self) -> bool:
        """Whether the seed changes what it assigns (the cross-input derangement, the position shuffles)."""
        return self.kind == REASSIGNMENT


VOCABULARY = (
    Condition("unperturbed", "the live model, controller running", LIVE),
    Condition("correct", "the window's own coefficients, replayed with the controller off", OWN),
    Condition(
        "cross_input",
        "another eval window's coefficients (donor: seeded derangement, or the donor you pick)",
        REASSIGNMENT,
        headline=True,
    ),
    Condition(
        "token_shuffle",
        "the window's own coefficients, positions permuted by one seeded permutation",
        REASSIGNMENT,
        headline=True,
    ),
    Condition(
        "global_mean", "one scalar: the mean of every coefficient over the calibration set", PROFILE, headline=True
    ),
    Condition("layer_scalar", "one scalar per layer (calibration mean)", PROFILE, retention=True),
    Condition(
        "layer_mean",
        "the static layerwise profile: per layer and slot (calibration mean)",
        PROFILE,
        retention=True,
        headline=True,
    ),
    Condition("layer_position_mean", "per layer, slot and position (calibration mean)", PROFILE, retention=True),
    Condition(
        "layer_mean_topk",
        "routers: each layer's k experts with the largest mean gate, for every token (calibration)",
        PROFILE,
        routers_only=True,
        retention=True,
    ),
)

ALL_CONDITIONS = tuple(c.name for c in VOCABULARY)  # every name audit.json may hold, in report order
CONDITIONS = tuple(c.name for c in VOCABULARY if not c.routers_only)  # section 4's: every model with a controller
ROUTING_CONDITIONS = tuple(c.name for c in VOCABULARY if c.routers_only)  # added for models with top-k routers
BASELINES = tuple(c.name for c in VOCABULARY if c.kind in (LIVE, OWN))  # a window's own values: no intervention
INTERVENTIONS = tuple(c.name for c in VOCABULARY if c.kind in (REASSIGNMENT, PROFILE))  # what the sweep replays
REASSIGNMENTS = tuple(c.name for c in VOCABULARY if c.kind == REASSIGNMENT)
SEEDED = tuple(c.name for c in VOCABULARY if c.seeded)
PROFILE_CONDITIONS = tuple(c.name for c in VOCABULARY if c.kind == PROFILE)  # need calibration profiles
STATIC_PROFILES = tuple(c for c in PROFILE_CONDITIONS if c in CONDITIONS)  # the profiles every controller has
# gap retention in report order: the static layerwise profile first, then the coarser and the finer ones
RETAINED = ("layer_mean", *(c.name for c in VOCABULARY if c.retention and c.name != "layer_mean"))
RETENTION_PROFILES = tuple(p for p in RETAINED if p in CONDITIONS)  # the retention every audit with a controller has
HEADLINE_CONDITIONS = tuple(c.name for c in VOCABULARY if c.headline)
CONDITION_HELP = {c.name: c.help for c in VOCABULARY}


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
