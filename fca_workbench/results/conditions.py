"""The condition vocabulary: the names of the conditions an audit replays, as ``audit.json`` spells them.

Names are part of the interface (design.md §4): ``audit.json``, the per-token files, the tables, the dashboard
and the CLI all use these, and only these, spellings.
"""

CONDITIONS = (
    "unperturbed",
    "correct",
    "cross_input",
    "token_shuffle",
    "global_mean",
    "layer_scalar",
    "layer_mean",
    "layer_position_mean",
)
STATIC_PROFILES = ("global_mean", "layer_scalar", "layer_mean", "layer_position_mean")
# For models with routers: each router's k experts with the largest mean gate, for every token.
ROUTING_CONDITIONS = ("layer_mean_topk",)
