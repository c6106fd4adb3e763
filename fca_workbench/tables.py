"""What the notebooks call as ``tables.<name>``: the results layer's tables and figures in one namespace.

The tables themselves live in ``fca_workbench.results`` (``tables``: the DataFrame and its renderings;
``audit_tables``: audits → tables; ``figures``; ``slots``); a notebook reads coefficient caches for its
heatmaps through ``open_cache`` and ``position_means`` here.
"""

from __future__ import annotations

import torch

from fca_workbench.audit.capture import CoefficientCache, open_cache
from fca_workbench.audit.interventions import static_profiles
from fca_workbench.results.audit_tables import (
    RETENTION_PROFILES,
    VARIANCE_COLUMNS,
    assignment_seed_table,
    assignment_table,
    execution_seed_table,
    execution_table,
    model_name,
    mudd_table,
    per_layer_seed_table,
    per_layer_table,
    positive_control_table,
    retention_seed_table,
    retention_table,
    training_dynamics_table,
    variation_seed_table,
    variation_table,
    with_controller,
)
from fca_workbench.results.figures import layer_position_matrix, mimebundle, show, show_in, write_figure
from fca_workbench.results.layout import cache_folder
from fca_workbench.results.profiles import load_profiles
from fca_workbench.results.slots import routers, slot_labels
from fca_workbench.results.tables import (
    Column,
    make_table,
    readable,
    styled,
    to_csv,
    to_latex,
    to_markdown,
    write_table,
)

__all__ = [
    "RETENTION_PROFILES",
    "VARIANCE_COLUMNS",
    "Column",
    "assignment_seed_table",
    "assignment_table",
    "cache_folder",
    "execution_seed_table",
    "execution_table",
    "layer_position_matrix",
    "load_profiles",
    "make_table",
    "mimebundle",
    "model_name",
    "mudd_table",
    "open_cache",
    "per_layer_seed_table",
    "per_layer_table",
    "position_means",
    "positive_control_table",
    "readable",
    "retention_seed_table",
    "retention_table",
    "routers",
    "show",
    "show_in",
    "slot_labels",
    "styled",
    "to_csv",
    "to_latex",
    "to_markdown",
    "training_dynamics_table",
    "variation_seed_table",
    "variation_table",
    "with_controller",
    "write_figure",
    "write_table",
]


def position_means(cache: CoefficientCache) -> list[torch.Tensor]:
    """Per layer ``[T, *slot]``: each coefficient's mean over the cached windows (the core's
    ``layer_position_mean`` profile, here of the eval set)."""
    return static_profiles(cache.batches())["layer_position_mean"]
