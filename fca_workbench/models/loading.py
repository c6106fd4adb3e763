"""Checkpoint folders in the official Hugging Face layout, read strictly; and sizing the audit to the device.

The MUDDPythia releases (github.com/Caiyun-AI/MUDDFormer, ``pytorch/muddpythia/``; MUDDPythia-1.4B and
-2.8B on the Hub) are folders with a ``config.json`` (``model_type: "muddpythia"``, an ``auto_map`` that
points at the release's own ``configuration_muddpythia.py`` / ``modeling_muddpythia.py``, ``torch_dtype``,
``architectures``), weights as ``model.safetensors``, as safetensors shards with
``model.safetensors.index.json``, or as ``pytorch_model.bin`` (also sharded, with its index), and the
GPT-NeoX tokenizer files. This module reads such a folder without ever executing its code:

* ``read_config`` parses ``config.json`` itself, **drops** ``auto_map`` before anything else sees it and
  builds the workbench's own config class for the ``model_type``; no Auto class and no
  ``trust_remote_code`` is involved, so the code files the ``auto_map`` names are never imported.
  A ``muddpythia`` config must carry every architecture field the official configs carry, with the right
  types; the config class then refuses shapes it does not build (``dense_type`` other than ``qkvr`` ...),
  and ``fca_workbench.models.limits`` refuses absurd sizes (a million layers, a billion-token context).
* ``check_weights`` first refuses a model whose parameters would not fit in the memory available, then
  reads only the names and shapes stored in the weight files (safetensors headers,
  ``torch.load(..., weights_only=True, map_location="meta")`` for ``.bin``) and compares them with the
  model built on the meta device: any missing key, unexpected key or wrong shape is one ``UserError``
  that names them. Weight files (and the shards an index names, ``index_shards``) are read only from
  inside the folder (``files.inside_folder``).
  Only then are the weights loaded (``from_pretrained`` of the concrete class, with
  ``weights_only=True``), and its own loading report must be empty too.

``save_official`` writes a model in that layout (the test and GPU-check helper), and ``audit_batch_size``
picks how many windows the audit runs at once when ``--batch-size`` is not given.
"""

import contextlib
import math
import re
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import logging as transformers_logging

from fca_workbench.foundation.checkpoint import (
    CONFIG_FILE,
    SAFETENSORS_WEIGHTS,
    WEIGHT_FILES,
    config_fields,
    model_type_of,
)
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import inside_folder, read_json, reading, safetensors_shapes
from fca_workbench.models.limits import check_map_names, check_memory, check_sizes, on_meta

Model = TypeVar("Model", bound=PreTrainedModel)


# Pointers to code shipped in the folder: removed from the config before it is used, never followed.
REMOTE_CODE_FIELDS = ("auto_map",)


OFFICIAL_AUTO_MAP = {
    "AutoConfig": "configuration_muddpythia.MUDDPythiaConfig",
    "AutoModelForCausalLM": "modeling_muddpythia.MUDDPythia",
}


# The code files in a release folder that its ``auto_map`` points at (never imported here).
CODE_FILES_NAMED_BY_AUTO_MAP = tuple(sorted({v.split(".")[0] + ".py" for v in OFFICIAL_AUTO_MAP.values()}))


# The official MUDDPythia-1.4B config.json, verbatim (github.com/Caiyun-AI/MUDDFormer at fc067b2,
# pytorch/muddpythia/config_1p4b.json).
OFFICIAL_1P4B_CONFIG = {
    "architectures": ["MUDDPythia"],
    "auto_map": OFFICIAL_AUTO_MAP,
    "block_size": 2048,
    "bos_token_id": 0,
    "dense": True,
    "dense_type": "qkvr",
    "dim": 2048,
    "dynamic_dense": True,
    "eos_token_id": 0,
    "expand_last": True,
    "head_dim": 128,
    "intermediate_size": 8192,
    "is_training": False,
    "model_type": "muddpythia",
    "n_head": 16,
    "n_layer": 24,
    "n_local_heads": 16,
    "norm_eps": 1e-05,
    "rope_base": 10000,
    "rotary_pct": 0.25,
    "round64": True,
    "sepln": True,
    "stack_hidden": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0",
    "use_gradient_checkpointing": False,
    "use_layer_cache": True,
    "use_linear_bias": True,
    "use_parallel_residual": True,
    "use_qk_norm": True,
    "vocab_size": 50432,
}


# Every field of the official configs that decides a parameter shape or the forward's arithmetic. The
# reference gives each a default, but a config.json without one of them is not an official config: with
# a silent default it would load a different architecture (or fail later with a less clear message).
MUDDPYTHIA_REQUIRED = {
    "block_size": int,
    "vocab_size": int,
    "n_layer": int,
    "n_head": int,
    "dim": int,
    "intermediate_size": int,
    "norm_eps": float,
    "rope_base": float,
    "rotary_pct": float,
    "use_qk_norm": bool,
    "use_parallel_residual": bool,
    "use_linear_bias": bool,
    "dense": bool,
    "dynamic_dense": bool,
    "dense_type": str,
    "sepln": bool,
    "expand_last": bool,
    "round64": bool,
}


# Zero-filled decode caches the reference registers as buffers in ``setup_caches``; a state dict saved
# after generating can hold them. They are not weights, so they are the only extra keys allowed.
MUDDPYTHIA_CACHE_KEYS = re.compile(r"^(layers\.\d+\.attention\.kv_cache\.[kv]_cache|layer_cache\.layer_cache)$")


NAMED_KEYS = 5  # how many keys of each kind an error names


def read_config(
    folder: Path, families: Mapping[str, tuple[type[PretrainedConfig], type[PreTrainedModel]]]
) -> PretrainedConfig:
    """The checkpoint's config as the workbench's own config class, ``auto_map`` dropped, never followed.

    ``families``: arch -> (config class, model class), the registry of ``fca_workbench.models``.
    """
    path = folder / CONFIG_FILE
    raw = config_fields(folder)
    model_type = model_type_of(raw, folder)
    by_type = {config_class.model_type: config_class for config_class, _ in families.values()}
    if model_type not in by_type:
        shown = "no model_type" if model_type is None else f"a '{model_type}' model"
        raise UserError(f"{folder} holds {shown}, not one of {sorted(families)}")
    fields = {key: value for key, value in raw.items() if key not in REMOTE_CODE_FIELDS}
    if model_type == "muddpythia":
        check_muddpythia_fields(fields, folder)
    config_class = by_type[model_type]
    with reading(str(path)):  # transformers' config parsing: its own types
        config = config_class.from_dict(fields)
    check_sizes(config, str(path))
    config._name_or_path = str(folder)
    return config


def check_muddpythia_fields(fields: dict, folder: Path) -> None:
    """Refuse a ``muddpythia`` config without the official architecture fields, or with wrong types."""
    missing = [name for name in MUDDPYTHIA_REQUIRED if name not in fields]
    wrong = [
        f"{name}={fields[name]!r} (expected {kind.__name__})"
        for name, kind in MUDDPYTHIA_REQUIRED.items()
        if name in fields and not _is_a(fields[name], kind)
    ]
    problems = []
    if missing:
        problems.append("missing " + ", ".join(missing))
    if wrong:
        problems.append("wrong type " + ", ".join(wrong))
    if problems:
        raise UserError(f"{folder / CONFIG_FILE} is not a MUDDPythia config: " + "; ".join(problems))


def _is_a(value, kind) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


def weights_file(folder: Path) -> Path:
    """The weight file (or shard index) the loader will read; a UserError when there is none."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise UserError(f"corrupt or missing weights in {folder}: no {', '.join(WEIGHT_FILES)}")


def stored_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors stored under ``path`` (a weight file or a shard index), data unread."""
    folder = path.parent
    if not path.name.endswith(".index.json"):
        return _file_shapes(inside_folder(folder, path.name, path.name))
    weight_map = read_weight_map(path)
    shapes, misplaced = {}, []
    for shard, shard_path in index_shards(path, weight_map).items():
        in_shard = _file_shapes(shard_path)
        misplaced += [k for k, s in weight_map.items() if s == shard and k not in in_shard]
        shapes.update(in_shard)
    if misplaced:
        raise UserError(
            f"corrupt or missing weights in {folder}: {path.name} lists {len(misplaced)} key(s) "
            f"not in their shard: {_some(misplaced)}"
        )
    return shapes


def read_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of a shard index, checked to map strings to strings."""
    folder = index.parent
    weight_map = cast(dict, read_json(index)).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in [*weight_map, *weight_map.values()]):
        raise UserError(
            f"corrupt or missing weights in {folder}: {index.name} has no weight_map of tensor names to file names"
        )
    return weight_map


def index_shards(index: Path, weight_map: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Every shard file a shard index names, each refused unless it lies inside the index's folder
    (``files.inside_folder``) and exists: what any loader may read for that index, checked before
    anything reads it."""
    folder = index.parent
    weight_map = read_weight_map(index) if weight_map is None else weight_map
    shards = {}
    for shard in sorted(set(weight_map.values())):
        shards[shard] = inside_folder(folder, shard, index.name)
        with reading(f"corrupt or missing weights in {folder}: {index.name} names shard {shard[:80]}"):
            found = shards[shard].is_file()  # an OSError for a name too long for the file system
        if not found:
            raise UserError(
                f"corrupt or missing weights in {folder}: {index.name} names shard {shard[:80]}, which is missing"
            )
    return shards


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix == ".safetensors":
        try:
            return safetensors_shapes(path)
        except UserError as exc:
            raise UserError(f"corrupt or missing weights in {path.parent}: {exc}") from None
    # ``.bin``: pickled state dict, read with the safe unpickler and no data (meta tensors)
    with reading(f"corrupt or missing weights in {path.parent}: {path.name}"):
        state = torch.load(path, map_location="meta", weights_only=True, mmap=zipfile.is_zipfile(path))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"corrupt or missing weights in {path.parent}: {path.name} is not a state dict of tensors")
    return {key: tuple(value.shape) for key, value in state.items()}


def expected_shapes(model: torch.nn.Module, config: PretrainedConfig) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Every state-dict key ``model`` (built on the meta device) has, with its shape, and the keys a checkpoint
    may leave out (tied)."""
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    optional = set()
    if getattr(config, "tie_word_embeddings", False):
        tied = getattr(model, "_tied_weights_keys", None) or {}
        optional = set(tied) if isinstance(tied, (dict, list, tuple, set)) else set()
    return shapes, optional


def check_weights(
    folder: Path,
    model_class: type[PreTrainedModel],
    config: PretrainedConfig,
    dtype: torch.dtype,
    fits_in_memory: bool = True,
) -> Path:
    """Check the model fits in memory in ``dtype`` (unless big-model inference places it: ``fits_in_memory``
    False), then compare the stored names and shapes with the model's, strictly; returns the weight file to load."""
    path = weights_file(folder)
    with reading(f"{folder / CONFIG_FILE} describes no {config.model_type} model that can be built"):
        skeleton = on_meta(lambda: model_class(config))  # a size of the wrong type, say
    expected, optional = expected_shapes(skeleton, config)
    if fits_in_memory:
        check_memory(skeleton, dtype.itemsize, str(folder), f"in {str(dtype).removeprefix('torch.')}", dtype)
    stored = stored_shapes(path)
    allowed_extra = MUDDPYTHIA_CACHE_KEYS if config.model_type == "muddpythia" else None
    missing = [k for k in expected if k not in stored and k not in optional]
    unexpected = [k for k in stored if k not in expected and not (allowed_extra and allowed_extra.match(k))]
    wrong = [
        f"{k} {list(stored[k])} in checkpoint vs {list(expected[k])} in model"
        for k in expected
        if k in stored and stored[k] != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {_some(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_some(unexpected)}")
    if wrong:
        problems.append(f"{len(wrong)} wrong shape(s): {_some(wrong)}")
    if problems:
        raise UserError(
            f"weights in {path} do not match the {config.model_type} config strictly: " + "; ".join(problems)
        )
    return path


@contextlib.contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """transformers' per-weight "Loading weights" bar off while a checkpoint loads, the user's setting restored
    after: the workbench reports its own progress, and in a notebook that bar's widget, closed as soon as the
    weights are in, left the explorer's output unable to show its figures."""
    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def load_weights(
    folder: Path,
    model_class: type[Model],
    config: PretrainedConfig,
    dtype: torch.dtype | None,
    placing: Mapping[str, Any] | None = None,
) -> Model:
    """``check_weights``, then load them (safe unpickling for ``.bin``) into the model, strictly; ``placing``:
    big-model inference's ``device_map``, ``max_memory`` and ``offload_folder`` (``adapters.placement``), under
    which the model need not fit in memory."""
    dtype = dtype or torch.float32
    path = check_weights(folder, model_class, config, dtype, fits_in_memory=placing is None)
    check_map_names(placing, lambda: model_class(config))
    with reading(f"corrupt or missing weights in {folder}"), quiet_weight_loading():  # their own error types
        loaded = model_class.from_pretrained(
            folder,
            config=config,
            dtype=dtype,
            local_files_only=True,
            use_safetensors=path.name in SAFETENSORS_WEIGHTS,
            weights_only=True,
            output_loading_info=True,
            **(placing or {}),
        )
        model, info = cast(tuple[Model, dict[str, list]], loaded)  # output_loading_info: (model, info)
    leftovers = {
        k: sorted(v) for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    unexpected = [k for k in leftovers.get("unexpected_keys", []) if not MUDDPYTHIA_CACHE_KEYS.match(k)]
    if leftovers.get("missing_keys") or leftovers.get("mismatched_keys") or unexpected or info.get("error_msgs"):
        raise UserError(f"weights in {path} did not load strictly: {leftovers or info.get('error_msgs')}")
    return model.eval()


def _some(items) -> str:
    items = list(items)
    shown = ", ".join(items[:NAMED_KEYS])
    return shown + (f", ... ({len(items) - NAMED_KEYS} more)" if len(items) > NAMED_KEYS else "")
