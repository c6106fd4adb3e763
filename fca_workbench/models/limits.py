"""Sanity limits on model sizes, checked from the config before any module is built.

A ``config.json`` (or ``fca train``'s flags) can ask for a million layers or a context of a billion tokens;
building that hangs or exhausts memory long before any useful error. The limits below lie far above
every model of these families (MUDDPythia-2.8B: 32 layers, width 2560, context 2048) and refuse only the
absurd; then the memory the sizes imply, parameters and buffers (counted on a model built on the meta device,
which allocates nothing), is checked against the memory this machine has available.

A limit is keyed by the name transformers resolves (``num_hidden_layers``); a config class's
``attribute_map`` says under which name a family stores it (GPT-2 and Bloom: ``n_layer``, MPT:
``n_layers``), so every name a size can be given under is checked, in the fields of a file before any
config is built (``check_fields``: some configs expand a size into per-layer lists while they are built) and
in the built config (``check_sizes``); sub-configs (a multimodal model's ``text_config``) are checked alike.
"""

import reprlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import torch
from transformers import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from fca_workbench.foundation.errors import UserError

# config field -> largest accepted value; every size field any family has (a family lacks some).
SIZE_LIMITS = {
    "n_layer": 256,  # the deepest released LLMs have about 128; the controllers grow with depth
    "n_head": 1024,
    "n_embd": 65_536,
    "dim": 65_536,
    "intermediate_size": 262_144,
    "gate_groups": 65_536,
    "block_size": 1 << 20,  # the context: position tables are sized by it
    "vocab_size": 1 << 22,
}


EXPERTS_LIMIT = 65_536
SUB_CONFIG_DEPTH = 4  # a text_config inside a multimodal config is depth 1; none in transformers is deeper than 2

# the same limits under transformers' names, for any causal-LM config.json (a family lacks some); a
# family's own names for them come from its ``attribute_map``, the few no map names are listed here
HF_SIZE_LIMITS = {
    "num_hidden_layers": SIZE_LIMITS["n_layer"],
    "num_attention_heads": SIZE_LIMITS["n_head"],
    "num_key_value_heads": SIZE_LIMITS["n_head"],
    "hidden_size": SIZE_LIMITS["n_embd"],
    "intermediate_size": SIZE_LIMITS["intermediate_size"],
    "moe_intermediate_size": SIZE_LIMITS["intermediate_size"],
    "n_inner": SIZE_LIMITS["intermediate_size"],
    "num_local_experts": EXPERTS_LIMIT,
    "num_experts": EXPERTS_LIMIT,
    "moe_num_experts": EXPERTS_LIMIT,
    "n_routed_experts": EXPERTS_LIMIT,
    "num_experts_per_tok": EXPERTS_LIMIT,
    "max_position_embeddings": SIZE_LIMITS["block_size"],
    "max_seq_len": SIZE_LIMITS["block_size"],
    "vocab_size": SIZE_LIMITS["vocab_size"],
}


def check_sizes(config: object, source: str, limits: dict = SIZE_LIMITS, none_allowed: bool = False) -> None:
    """Refuse a size of the built ``config`` that is not a whole number in 1..its limit (each element of a
    per-layer list alike), naming the field as the config stores it. ``none_allowed``: a field may be None
    (transformers configs leave some so, for a default derived from others)."""
    for name, value, limit in _sizes(config, limits):
        _check(name, value, limit, source, none_allowed)


def check_fields(fields: Mapping, config_class: type | None, source: str, limits: dict, none_allowed: bool) -> None:
    """Refuse a size in the fields of a config file above its limit, before ``config_class`` (None: a class
    not known here, so only the names in ``limits``) builds anything from them; wrong types and values below
    1 are left to the config class, and to ``check_sizes`` on what it built."""
    for name, value, limit in _field_sizes(fields, config_class, limits, ""):
        _check(name, value, limit, source, none_allowed, only_too_large=True)


def _aliases(config_class: type | None) -> Mapping[str, str]:
    aliases = getattr(config_class, "attribute_map", None)
    return aliases if isinstance(aliases, Mapping) else {}


def _sizes(config: object, limits: dict, prefix: str = "") -> Iterator[tuple[str, object, int]]:
    """(name, value, limit) of every size ``config`` holds, under the name it holds it by."""
    fields, aliases = vars(config), _aliases(type(config))
    for field, limit in limits.items():
        stored = aliases.get(field, field)
        if stored in fields:
            yield prefix + stored, fields[stored], limit
    for key, value in fields.items():
        if isinstance(value, PretrainedConfig) and prefix.count(".") < SUB_CONFIG_DEPTH:
            yield from _sizes(value, limits, f"{prefix}{key}.")


def _field_sizes(
    fields: Mapping, config_class: type | None, limits: dict, prefix: str
) -> Iterator[tuple[str, object, int]]:
    aliases = _aliases(config_class)
    for field, limit in limits.items():
        for name in dict.fromkeys((field, aliases.get(field, field))):
            if name in fields:
                yield prefix + name, fields[name], limit
    sub_configs = getattr(config_class, "sub_configs", None) or {}
    for key, value in fields.items():
        is_sub_config = key in sub_configs or (config_class is None and key.endswith("_config"))
        if isinstance(value, Mapping) and is_sub_config and prefix.count(".") < SUB_CONFIG_DEPTH:
            yield from _field_sizes(value, _concrete(sub_configs.get(key), value), limits, f"{prefix}{key}.")


def _concrete(config_class: type | None, fields: Mapping) -> type | None:
    """The config class a sub-config's fields build: an ``AutoConfig`` entry is resolved by their model_type."""
    if config_class is None or issubclass(config_class, PretrainedConfig):
        return config_class
    model_type = fields.get("model_type")
    return CONFIG_MAPPING[model_type] if isinstance(model_type, str) and model_type in CONFIG_MAPPING else None


def _check(name: str, value: object, limit: int, source: str, none_allowed: bool, only_too_large: bool = False) -> None:
    """One size, or each element of a flat per-layer list (Gemma3n) or per-part object (LXMERT) of sizes."""
    if value is None and none_allowed:
        return
    if isinstance(value, Mapping) and value:
        parts = [(f"{name}[{key!r}]", item) for key, item in value.items()]
    elif isinstance(value, (list, tuple)) and value:
        parts = [(f"{name}[{n}]", item) for n, item in enumerate(value)]
    else:
        parts = [(name, value)]
    for shown, item in parts:
        whole = item if isinstance(item, int) and not isinstance(item, bool) else None
        if only_too_large and (whole is None or whole <= limit):
            continue
        if whole is None or not 1 <= whole <= limit:
            raise UserError(
                f"{source}: {shown}={reprlib.repr(item)} is out of range (a whole number from 1 to {limit:,})"
            )


def on_meta(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The module ``build()`` makes, built on the meta device: its parameters and buffers have shapes and
    dtypes but no memory."""
    with torch.device("meta"):
        return build()


MAP_NAMES_SHOWN = 5


def check_map_names(placing: Mapping[str, Any] | None, build: Callable[[], torch.nn.Module]) -> None:
    """A ``--device-map FILE.json`` (big-model inference's ``placing``) must name modules or weights of the
    model ``build()`` makes, checked on that model built on the meta device before any weight is read:
    transformers takes a map of other names and places nothing by them (or stops with a list of every weight
    the map misses, none of the names that are wrong)."""
    device_map = (placing or {}).get("device_map")
    if not isinstance(device_map, Mapping):
        return
    with torch.device("meta"):
        skeleton = build()
    names = {name for name, _ in skeleton.named_modules()} | set(skeleton.state_dict(keep_vars=True))
    unknown = [name for name in device_map if name not in names]
    if unknown:
        shown = ", ".join(repr(name[:80]) for name in unknown[:MAP_NAMES_SHOWN])
        more = f" and {len(unknown) - MAP_NAMES_SHOWN} more" if len(unknown) > MAP_NAMES_SHOWN else ""
        raise UserError(
            f"--device-map names {len(unknown)} module(s) the model does not have: {shown}{more} "
            f"(its top-level modules: {', '.join(name for name, _ in skeleton.named_children())})"
        )


def check_memory(
    skeleton: torch.nn.Module, bytes_per_parameter: float, source: str, purpose: str, dtype: torch.dtype | None = None
) -> None:
    """Refuse a model (``skeleton``, built on the meta device) whose parameters, at ``bytes_per_parameter``,
    and buffers, persistent or not (a causal mask the size of the context squared: gpt_neo's is 16 GiB a layer
    at 131,072 positions), would not fit in the memory available now. ``dtype``: what floating buffers are
    loaded in (default: as built)."""
    parameters = sum(p.numel() for p in skeleton.parameters())
    buffers = sum(
        b.numel() * (dtype.itemsize if dtype is not None and b.is_floating_point() else b.element_size())
        for b in skeleton.buffers()
    )
    needed, available = parameters * bytes_per_parameter + buffers, psutil.virtual_memory().available
    if needed > available:
        raise UserError(
            f"{source}: the config's sizes imply {parameters:,} parameters and {buffers / 2**30:,.1f} GiB of "
            f"buffers, {needed / 2**30:,.1f} GiB {purpose}, more than the {available / 2**30:,.1f} GiB of memory "
            "available"
        )
