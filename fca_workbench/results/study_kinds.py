"""The design studies told apart: each ``StudyKind`` names its shipped folder, its design axes and the figures it
tabulates, so ``design_study`` reads the controller-design study (issue 27, FeatureGate) and the router-design
study (issue 38, mixtures of experts) with one reader.
"""

from dataclasses import dataclass
from pathlib import Path

from fca_workbench.foundation.resources import shipped
from fca_workbench.results.conditions import LAYER_MEAN, LAYER_MEAN_TOPK
from fca_workbench.results.layout import FINETUNE_FOLDER
from fca_workbench.results.tabular import Column

DEFAULT_VARIANT = "default"
OTHER_AXIS = "other"


@dataclass(frozen=True, eq=False)  # one object per study: hashed by identity (summary_schema caches per kind)
class StudyKind:
    """What differs between the design studies: their shipped folder, their axes and the figures they tabulate.

    A variant's name is ``<axis prefix>-<setting>`` (``groups-96``); ``axes``: each prefix's label and the training
    setting (in the model card, a dotted path below ``settings``) that holds the variant's value on it (None: the
    name's). ``figures``: column -> where the figure is in a run's summary (``derived.*``: computed from it by
    ``derived_figures``), ``cis``: the audit's 95% CI of a figure where it gives one. ``retentions``: the retention
    profiles the figures read, required of a summary."""

    name: str
    title: str
    folder: Path
    axes: dict[str, tuple[str, str | None]]
    figures: dict[str, str]
    cis: dict[str, str]
    columns: list[Column]
    retentions: tuple[str, ...]
    required: tuple[str, ...] = ()  # more top-level summary fields the figures read
    stages: tuple[str, ...] = ()  # subfolders of the study folder that hold a later stage, not a run


COMMON_FIGURES = {
    "eval_nll": "eval_nll",
    "retention_layer_mean": "retention.layer_mean.value",
    "r2_layer": "variance.r2_layer",
    "r2_layer_slot": "variance.r2_layer_slot",
    "delta_cross_input": "conditions.cross_input.delta",
    "delta_token_shuffle": "conditions.token_shuffle.delta",
}
COMMON_CIS = {
    "retention_layer_mean": "retention.layer_mean.ci95",
    "delta_cross_input": "conditions.cross_input.delta_ci95",
    "delta_token_shuffle": "conditions.token_shuffle.delta_ci95",
}
COMMON_COLUMNS = [
    Column("eval_nll", "eval NLL", "float"),
    Column("retention_layer_mean", "retention layer_mean", "pct"),
    Column("r2_layer", "R² layer", "pct"),
    Column("r2_layer_slot", "R² layer×slot", "pct"),
    Column("delta_cross_input", "ΔNLL cross_input", "delta"),
    Column("delta_token_shuffle", "ΔNLL token_shuffle", "delta"),
]

CONTROLLER_STUDY = StudyKind(
    name="controller_design",
    title="Controller design",
    folder=shipped("data") / "controller_design",  # the shipped study, in a checkout or a wheel
    axes={
        "range": ("gate range", "gate_range"),
        "input": ("gate input", "gate_input"),
        "groups": ("gate groups", "gate_groups"),
        "cwd": ("controller weight decay", "controller_weight_decay"),
        "clr": ("controller lr multiplier", "controller_lr_mult"),
        "wide": ("width × depth", None),
        "combo": ("combo", None),
    },
    figures=COMMON_FIGURES,
    cis=COMMON_CIS,
    columns=COMMON_COLUMNS,
    retentions=(LAYER_MEAN,),
)
ROUTER_STUDY = StudyKind(
    name="router_design",
    title="Router design",
    folder=shipped("data") / "router_design",
    axes={
        "experts": ("experts", "hf_config.num_local_experts"),
        "topk": ("top-k", "hf_config.num_experts_per_tok"),
        "lb": ("load-balancing weight", "hf_config.router_aux_loss_coef"),
        "zloss": ("router z-loss", "router_z_loss"),
        "input": ("router input", "router_input"),
        "shared": ("shared expert", None),
        "wide": ("width × depth", None),
    },
    figures={
        **COMMON_FIGURES,
        "retention_layer_mean_topk": "derived.topk_vs_all_experts",
        "retention_topk_matched": "derived.topk_vs_random_topk",
        "export_eval_nll": "export_eval_nll",
        "export_cost": "derived.export_cost",
        "expert_entropy": "derived.expert_entropy",
    },
    cis=COMMON_CIS,
    columns=[
        *COMMON_COLUMNS[:2],
        Column("retention_topk_matched", "retention layer_mean_topk / random_topk", "pct"),
        Column("retention_layer_mean_topk", "retention layer_mean_topk / global_mean", "pct"),
        Column("export_eval_nll", "export eval NLL", "float"),
        Column("export_cost", "export − model NLL", "delta"),
        Column("expert_entropy", "expert-use entropy", "pct"),
        *COMMON_COLUMNS[2:],
    ],
    retentions=(LAYER_MEAN, LAYER_MEAN_TOPK),
    required=("export_eval_nll", "execution"),
    stages=(FINETUNE_FOLDER,),
)
