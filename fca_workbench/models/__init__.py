"""The model families, registered with the Auto classes so ``from_pretrained`` resolves them offline."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from fca_workbench.foundation.checkpoint import Checkpoint, resolve_checkpoint
from fca_workbench.models.common import (
    CoefficientLMOutput,
    CoefficientModel,
    PositiveControl,
    head_nll,
    index_slot_labels,
    next_token_nll,
)
from fca_workbench.models.dense import DenseConfig, DenseForCausalLM
from fca_workbench.models.featuregate import FeatureGateConfig, FeatureGateForCausalLM
from fca_workbench.models.loading import load_weights, read_config
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM

__all__ = [
    "FAMILIES",
    "CoefficientLMOutput",
    "CoefficientModel",
    "PositiveControl",
    "family_slot_labels",
    "head_nll",
    "load_model",
    "next_token_nll",
]

FAMILIES: dict[str, tuple[type[PretrainedConfig], type[CoefficientModel]]] = {
    "dense": (DenseConfig, DenseForCausalLM),
    "featuregate": (FeatureGateConfig, FeatureGateForCausalLM),
    "muddpythia": (MUDDPythiaConfig, MUDDPythiaForCausalLM),
}

for _config_class, _model_class in FAMILIES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModelForCausalLM.register(_config_class, _model_class, exist_ok=True)


def family_slot_labels(arch: str, slot_shape: tuple[int, ...]) -> list[str]:
    """The slot names family ``arch`` declares for a coefficient of ``slot_shape`` (generic ``slot i`` for an
    arch that is no native family): what ``model.slot_labels`` records, for readers that have only the arch
    (audits written before it was recorded)."""
    family = FAMILIES.get(arch)
    return family[1].slot_labels_for(tuple(slot_shape)) if family else index_slot_labels(tuple(slot_shape))


def load_model(
    path: str | Path | Checkpoint, dtype: torch.dtype | None = None, placing: Mapping[str, Any] | None = None
) -> CoefficientModel:
    """Load a checkpoint of one of the workbench's own families (``FAMILIES``: dense, featuregate, muddpythia)
    strictly, turning every way it can be broken into one-line UserErrors.

    Workbench folders and the official Hugging Face layout of the MUDDPythia releases alike: the config is
    read from ``config.json`` with its ``auto_map`` dropped (code shipped in the folder is never imported,
    and no Auto class or ``trust_remote_code`` is involved), and the stored weight names and shapes must
    match the model exactly before anything is loaded (see ``fca_workbench.models.loading``). A hub name is
    accepted for these families only; any other model (a Mixtral, a Mamba, ...) is refused with one line and
    loads through ``fca_workbench.adapters.controlled.load_controlled``, which takes hub names of any family.

    :param path: a checkpoint folder, a hub name ``ORG/NAME[@REVISION]`` (read from the Hugging Face cache, or
        downloaded unless ``HF_HUB_OFFLINE`` is set) or a ``Checkpoint`` already resolved
        (``fca_workbench.foundation.checkpoint``).
    :param dtype: the dtype of the loaded weights; None: the checkpoint's own.
    :param placing: big-model inference's ``from_pretrained`` arguments
        (``adapters.placement.Placement.loading_kwargs``); None: one device holds the whole model.
    :returns: the model, in eval mode as ``from_pretrained`` leaves it.
    """
    folder = (path if isinstance(path, Checkpoint) else resolve_checkpoint(path)).folder
    config = read_config(folder, FAMILIES)
    model_class = next(cls for cfg, cls in FAMILIES.values() if type(config) is cfg)
    return load_weights(folder, model_class, config, dtype, placing)
