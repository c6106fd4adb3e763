"""Loading any checkpoint folder as a controlled model (``fca_workbench.adapters.protocol``).

Native folders (``dense``, ``featuregate``, ``muddpythia``, and the official MUDDPythia layout) load
strictly through ``fca_workbench.models``. Any other ``model_type`` that transformers knows is loaded with
``AutoModelForCausalLM.from_pretrained`` from safetensors, locally, with no code from the folder unless the
user passes ``trust_remote_code`` (which runs the folder's code), and wrapped in ``TransformersControlled``.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.errors import UserError
from fca_workbench.files import reading
from fca_workbench.models import FAMILIES, load_model
from fca_workbench.models.limits import HF_SIZE_LIMITS, check_memory, check_sizes, parameters_on_meta
from fca_workbench.models.loading import CONFIG_FILE, config_fields, model_type_of, stored_shapes, weights_file
from fca_workbench.resources import is_checkpoint


def load_controlled(
    path: str | Path, dtype: torch.dtype | None = None, controllers: str | None = None, trust_remote_code: bool = False
) -> ControlledModel:
    """The model in ``path`` as a controlled model; every way the folder can be wrong is a one-line UserError.

    ``controllers``: a regex naming the controller modules of a foreign model (whole module paths); None:
    the built-in kinds (MoE routers, shared-expert gates) find them.
    """
    folder = Path(path)
    if not is_checkpoint(folder):
        return load_model(folder, dtype)  # its own one-line errors for a missing folder / config
    raw = config_fields(folder)
    native = {config_class.model_type for config_class, _ in FAMILIES.values()} | set(FAMILIES)
    if model_type_of(raw, folder / CONFIG_FILE) in native:
        if controllers is not None:
            raise UserError(
                f"--controllers is for foreign models; {folder} is a workbench model with its own controllers"
            )
        return load_model(folder, dtype)
    return TransformersControlled(load_transformers(folder, raw, dtype, trust_remote_code), controllers)


@contextlib.contextmanager
def controlled_view(model: Any) -> Iterator[ControlledModel]:
    """``model`` seen through the protocol for the duration of the block: a workbench model as it is, a
    transformers model (one being trained, say) wrapped in ``TransformersControlled``. Wrapping switches the
    model to eval mode and the eager experts; both are put back on exit, so training goes on as before."""
    was_training = model.training
    experts = None
    try:
        if hasattr(model, "replay_run"):  # a workbench model, or one already wrapped
            yield model
        else:
            if hasattr(model, "get_experts_implementation"):
                experts = model.get_experts_implementation()
            yield TransformersControlled(model)
    finally:
        if experts is not None:
            model.set_experts_implementation(experts)
        model.train(was_training)


def load_transformers(folder: Path, raw: dict, dtype: torch.dtype | None, trust_remote_code: bool) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` from local safetensors; remote code only when asked."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if raw.get("auto_map") and not trust_remote_code:
        raise UserError(
            f"{folder} needs its own code (config.json has an auto_map); pass --trust-remote-code "
            "to run the code in that folder, only if you trust it"
        )
    if not raw.get("auto_map") and model_type not in CONFIG_MAPPING:
        shown = "no model_type" if model_type is None else f"model_type '{model_type}'"
        raise UserError(f"{folder} has {shown}, which neither the workbench nor transformers knows")
    if not any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise UserError(f"{folder} has no safetensors weights (model.safetensors); other formats are not loaded")
    dtype = dtype or torch.float32
    stored_shapes(weights_file(folder))  # every header checked against its file before transformers reads it
    with reading(f"cannot load {folder} with transformers"):  # config parsing, safetensors: their own types
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
        check_sizes(config, str(folder / "config.json"), HF_SIZE_LIMITS, none_allowed=True)
        parameters = parameters_on_meta(
            lambda: AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        )
        check_memory(parameters, dtype.itemsize, str(folder), f"in {str(dtype).removeprefix('torch.')}")
        return AutoModelForCausalLM.from_pretrained(
            folder,
            config=config,
            dtype=dtype,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
        )
