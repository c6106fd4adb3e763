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
    AUDIT_CONDITIONS,
    CONDITION_COLUMNS,
    CONTROL_COLUMNS,
    DYNAMICS_COLUMNS,
    EXECUTION_COLUMNS,
    MUDD_CONDITIONS,
    RETENTION_PROFILES,
    ROUTER_DYNAMICS_COLUMNS,
    VARIANCE_COLUMNS,
    VARIANCE_PATHS,
    assignment_seed_table,
    assignment_table,
    by_configuration,
    condition_rows,
    execution_seed_table,
    execution_table,
    model_name,
    mudd_table,
    per_controller_table,
    per_layer_seed_table,
    per_layer_table,
    positive_control_table,
    seed_rows,
    seed_summary,
    training_dynamics_table,
    variation_seed_table,
    variation_table,
    with_controller,
)
from fca_workbench.results.conditions import LAYER_POSITION_MEAN
from fca_workbench.results.design_study import (
    design_points,
    design_runs_table,
    design_seed_table,
    read_design_study,
)
from fca_workbench.results.figures import (
    OKABE_ITO,
    audit_caption,
    design_axis_figure,
    errors_shown_in,
    layer_position_matrix,
    mimebundle,
    show,
    show_in,
    show_text_in,
    use_paper_style,
    write_figure,
)
from fca_workbench.results.finetune_study import (
    finetune_runs_table,
    finetune_seed_table,
    read_finetunes,
)
from fca_workbench.results.layout import FINETUNE_FOLDER, cache_folder
from fca_workbench.results.overview import overview_table
from fca_workbench.results.profiles import load_profiles, profiles_from_tensors, save_profiles
from fca_workbench.results.retention_tables import retention_points, retention_seed_table, retention_table
from fca_workbench.results.slots import routers, slot_labels
from fca_workbench.results.study_kinds import ROUTER_STUDY
from fca_workbench.results.tabular import (
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
    "AUDIT_CONDITIONS",
    "CONDITION_COLUMNS",
    "CONTROL_COLUMNS",
    "CoefficientCache",
    "Column",
    "DYNAMICS_COLUMNS",
    "EXECUTION_COLUMNS",
    "FINETUNE_FOLDER",
    "MUDD_CONDITIONS",
    "OKABE_ITO",
    "RETENTION_PROFILES",
    "ROUTER_DYNAMICS_COLUMNS",
    "ROUTER_STUDY",
    "VARIANCE_COLUMNS",
    "VARIANCE_PATHS",
    "assignment_seed_table",
    "audit_caption",
    "assignment_table",
    "by_configuration",
    "cache_folder",
    "condition_rows",
    "design_axis_figure",
    "design_points",
    "design_runs_table",
    "design_seed_table",
    "errors_shown_in",
    "execution_seed_table",
    "execution_table",
    "finetune_runs_table",
    "finetune_seed_table",
    "layer_position_matrix",
    "load_profiles",
    "make_table",
    "mimebundle",
    "model_name",
    "mudd_table",
    "open_cache",
    "overview_table",
    "per_controller_table",
    "per_layer_seed_table",
    "per_layer_table",
    "position_means",
    "positive_control_table",
    "profiles_from_tensors",
    "read_design_study",
    "read_finetunes",
    "readable",
    "retention_points",
    "retention_seed_table",
    "retention_table",
    "routers",
    "save_profiles",
    "seed_rows",
    "seed_summary",
    "show",
    "show_in",
    "show_text_in",
    "slot_labels",
    "styled",
    "to_csv",
    "to_latex",
    "to_markdown",
    "training_dynamics_table",
    "use_paper_style",
    "variation_seed_table",
    "variation_table",
    "with_controller",
    "write_figure",
    "write_table",
]


def position_means(cache: CoefficientCache) -> list[torch.Tensor]:
    """Per layer ``[T, *slot]``: each coefficient's mean over the cached windows (the core's
    ``layer_position_mean`` profile, here of the eval set)."""
    return static_profiles(cache.batches())[LAYER_POSITION_MEAN]
