"""Loading any checkpoint folder as a controlled model (``fca_workbench.adapters.protocol``).

Native folders (``dense``, ``featuregate``, ``muddpythia``, and the official MUDDPythia layout) load strictly
through ``fca_workbench.models``. Any other ``model_type`` that transformers knows is loaded with
``AutoModelForCausalLM.from_pretrained`` from safetensors, locally, with no code from the folder unless the
user passes ``trust_remote_code`` (which runs the folder's code), and wrapped in ``TransformersControlled``.

``open_checkpoint`` is the whole load of a checkpoint resolved once (``checkpoint.resolve_checkpoint``), in
order: the device checked, the placement across devices (if any), the model loaded and moved to the device,
its tokenizer checked against the model's vocabulary.
"""

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.placement import Placement, check_device, placed, placement
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.foundation.checkpoint import (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_WEIGHTS,
    Checkpoint,
    config_fields,
    model_type_of,
    resolve_checkpoint,
)
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import inside_folder, reading
from fca_workbench.models import FAMILIES, load_model
from fca_workbench.models.limits import (
    HF_SIZE_LIMITS,
    check_fields,
    check_map_names,
    check_memory,
    check_sizes,
    on_meta,
)
from fca_workbench.models.loading import quiet_weight_loading, stored_shapes

# the model types (and family names) of the workbench's own families, which load through fca_workbench.models
NATIVE_MODEL_TYPES = frozenset({config_class.model_type for config_class, _ in FAMILIES.values()} | set(FAMILIES))


def open_checkpoint(
    checkpoint: Checkpoint,
    dtype: torch.dtype,
    *,
    controllers: str | None = None,
    only_controllers: str | None = None,
    trust_remote_code: bool = False,
    device: str = "cpu",
    device_map: str | None = None,
    max_memory: str | None = None,
    offload_folder: str | None = None,
    offload_outside: Mapping[str, str | Path | None] | None = None,
    ranks: Any = None,
) -> tuple[ControlledModel, PreTrainedTokenizerBase]:
    """The controlled model of ``checkpoint`` and its tokenizer, checked against each other: on ``device`` in
    ``dtype``, or placed across devices, CPU and disk by big-model inference (``device_map``, ``max_memory``,
    ``offload_folder``: ``placement.placement``, the offload folder outside the checkpoint and the folders
    ``offload_outside`` names by what they are; under torchrun, ``ranks``, on this rank's own devices).
    ``controllers``, ``only_controllers``, ``trust_remote_code``: as ``load_controlled`` takes them."""
    check_device(device)
    outside = {"checkpoint": checkpoint.folder, **(offload_outside or {})}
    place = placement(device_map, max_memory, offload_folder, device, outside, ranks)
    model = placed(  # offloaded weights, if any, removed with the model
        place,
        lambda place: load_controlled(checkpoint, dtype, controllers, trust_remote_code, only_controllers, place),
    )
    if device_map is None:
        model.to(device)
    tokenizer = load_tokenizer(checkpoint.folder)
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(
            f"the tokenizer in {checkpoint.folder} has {len(tokenizer)} tokens, more than the model's "
            f"vocabulary of {model.config.vocab_size}: they do not belong together"
        )
    return model, tokenizer


def load_controlled(
    path: str | Path | Checkpoint,
    dtype: torch.dtype | None = None,
    controllers: str | None = None,
    trust_remote_code: bool = False,
    only_controllers: str | None = None,
    placement: Placement | None = None,
) -> ControlledModel:
    """The model in ``path`` (a folder, a hub name ``ORG/NAME[@REVISION]``, or a ``Checkpoint`` already resolved)
    as a controlled model; every way the folder can be wrong is a one-line UserError.

    A foreign model's controllers are found by the built-in kinds (MoE routers, shared-expert gates,
    selective SSMs and gates), plus the modules ``controllers`` names (a regex over whole module paths), or,
    with ``only_controllers``, the modules it names alone. ``placement``: big-model inference places the
    model across devices, CPU and disk (``adapters.placement``), instead of one device holding it whole.
    """
    # a hub name resolved (code files fetched only with trust_remote_code); links out of the folder refused
    checkpoint = path if isinstance(path, Checkpoint) else resolve_checkpoint(path, trust_remote_code)
    folder = checkpoint.folder
    raw = config_fields(folder)
    placing = placement.loading_kwargs() if placement is not None else None
    if model_type_of(raw, folder) in NATIVE_MODEL_TYPES:
        if controllers is not None or only_controllers is not None:
            raise UserError(
                f"--controllers is for foreign models; {folder} is a workbench model with its own controllers"
            )
        return load_model(checkpoint, dtype, placing)
    model = load_transformers(folder, raw, dtype, trust_remote_code, placing)
    return TransformersControlled(model, controllers, only_controllers)


@contextlib.contextmanager
def controlled_view(model: Any) -> Iterator[ControlledModel]:
    """``model`` seen through the protocol for the duration of the block: a workbench model as it is, a
    transformers model (one being trained, say) wrapped in ``TransformersControlled``. Wrapping switches the
    model to eval mode (its experts run as they are); its mode is put back on exit, so training goes on as
    before."""
    was_training = model.training
    try:
        yield controlled_model(model)
    finally:
        model.train(was_training)


def controlled_model(
    model: Any, controllers: str | None = None, only_controllers: str | None = None
) -> ControlledModel:
    """A model held in memory seen through the protocol: a workbench model as it is, a transformers causal LM
    wrapped in ``TransformersControlled`` (its controllers found by role, plus ``controllers`` or instead
    ``only_controllers``, as ``load_controlled`` takes them); anything else is one line."""
    if hasattr(model, "replay_run"):
        if controllers is not None or only_controllers is not None:
            raise UserError("--controllers is for foreign models; a workbench model has its own controllers")
        return model
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise UserError(f"cannot audit a {type(model).__name__}: give a transformers causal LM or a workbench model")
    return TransformersControlled(model, controllers, only_controllers)


def causal_lm_class(config: Any, folder: Path) -> Any:
    """The class that loads ``config``'s folder as a causal LM: ``AutoModelForCausalLM`` where its mapping
    has the config; else the family's own ``*ForCausalLM`` for this config class (Mistral-4, say); else, for
    a multimodal model, its image-text-to-text class, run on text alone. An encoder-decoder or a text model
    without a language-model head is refused in one line."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    modeling = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    for name in sorted(dir(modeling)):
        candidate = getattr(modeling, name)
        if name.endswith("ForCausalLM") and getattr(candidate, "config_class", None) is type(config):
            return candidate
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"{folder} is an encoder-decoder ({config.model_type}); the workbench audits causal LMs")
    if type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    raise UserError(f"{folder}: transformers has no causal LM for model_type '{config.model_type}'")


def load_transformers(
    folder: Path,
    raw: dict,
    dtype: torch.dtype | None,
    trust_remote_code: bool,
    placing: Mapping[str, Any] | None = None,
) -> nn.Module:
    """``causal_lm_class(config).from_pretrained`` from local safetensors; remote code only when asked;
    ``placing``: big-model inference's arguments, under which the model need not fit in memory."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if raw.get("auto_map") and not trust_remote_code:
        raise UserError(
            f"{folder} needs its own code ({CONFIG_FILE} has an auto_map); pass --trust-remote-code "
            "to run the code in that folder, only if you trust it"
        )
    if raw.get("auto_map"):
        check_code_inside(folder, raw["auto_map"])
    if not raw.get("auto_map") and model_type not in CONFIG_MAPPING:
        shown = "no model_type" if model_type is None else f"model_type '{model_type}'"
        raise UserError(f"{folder} has {shown}, which neither the workbench nor transformers knows")
    check_safetensors_inside(folder)
    config_class = None if raw.get("auto_map") else CONFIG_MAPPING[str(model_type)]
    check_fields(raw, config_class, str(folder / CONFIG_FILE), HF_SIZE_LIMITS, none_allowed=True)
    dtype = dtype or torch.float32
    with reading(f"cannot load {folder} with transformers"):  # config parsing, safetensors: their own types
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
        check_sizes(config, str(folder / CONFIG_FILE), HF_SIZE_LIMITS, none_allowed=True)
        model_class: Any = AutoModelForCausalLM if raw.get("auto_map") else causal_lm_class(config, folder)
        remote = {"trust_remote_code": trust_remote_code} if hasattr(model_class, "from_config") else {}
        build = getattr(model_class, "from_config", None) or model_class._from_config
        skeleton = on_meta(lambda: build(config, **remote))
        if placing is None:
            check_memory(skeleton, dtype.itemsize, str(folder), f"in {str(dtype).removeprefix('torch.')}", dtype)
        check_map_names(placing, lambda: build(config, **remote))
        with quiet_weight_loading():
            return model_class.from_pretrained(
                folder,
                config=config,
                dtype=dtype,
                local_files_only=True,
                use_safetensors=True,
                **remote,
                **(placing or {}),
            )


def check_safetensors_inside(folder: Path) -> None:
    """The weight files ``from_pretrained`` may read (``model.safetensors``, the shards its index names) must
    exist and lie inside ``folder``, checked before transformers reads any (it follows ``..`` and links)."""
    present = [name for name in SAFETENSORS_WEIGHTS if (folder / name).is_file()]
    if not present:
        raise UserError(f"{folder} has no safetensors weights ({SAFETENSORS_FILE}); other formats are not loaded")
    for name in present:  # every header checked against its file, every shard inside the folder
        stored_shapes(inside_folder(folder, name, name))


def check_code_inside(folder: Path, auto_map: object) -> None:
    """``--trust-remote-code`` runs the folder's own code only: an ``auto_map`` entry ``repo--module.Class``
    would import code from another repository or folder, so it is refused."""
    entries = list(auto_map.values()) if isinstance(auto_map, dict) else None
    if entries is None or not all(isinstance(entry, (str, list, type(None))) for entry in entries):
        raise UserError(f"{folder / CONFIG_FILE}: auto_map is not an object of class references")
    references = [ref for entry in entries for ref in (entry if isinstance(entry, list) else [entry])]
    elsewhere = [ref for ref in references if not isinstance(ref, (str, type(None))) or (ref and "--" in ref)]
    if elsewhere:
        raise UserError(
            f"{folder / CONFIG_FILE}: auto_map names code outside the folder ({elsewhere[0]!r}); "
            "only the folder's own code is run"
        )
