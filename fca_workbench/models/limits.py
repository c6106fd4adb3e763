"""Sanity limits on model sizes, checked from the config before any module is built.

A ``config.json`` (or ``fca train``'s flags) can ask for a million layers or a context of a billion tokens;
building that hangs or exhausts memory long before any useful error. The limits below lie far above
every model of these families (MUDDPythia-2.8B: 32 layers, width 2560, context 2048) and refuse only the
absurd; then the parameter count the sizes imply (counted on a model built on the meta device, which
allocates nothing) is checked against the memory this machine has available.
"""

from collections.abc import Callable

import psutil
import torch

from fca_workbench.errors import UserError

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


# the same limits under transformers' names, for any causal-LM config.json (a family lacks some)
HF_SIZE_LIMITS = {
    "num_hidden_layers": SIZE_LIMITS["n_layer"],
    "num_attention_heads": SIZE_LIMITS["n_head"],
    "num_key_value_heads": SIZE_LIMITS["n_head"],
    "hidden_size": SIZE_LIMITS["n_embd"],
    "intermediate_size": SIZE_LIMITS["intermediate_size"],
    "moe_intermediate_size": SIZE_LIMITS["intermediate_size"],
    "num_local_experts": 65_536,
    "num_experts": 65_536,
    "num_experts_per_tok": 65_536,
    "max_position_embeddings": SIZE_LIMITS["block_size"],
    "vocab_size": SIZE_LIMITS["vocab_size"],
}


def check_sizes(config: object, source: str, limits: dict = SIZE_LIMITS, none_allowed: bool = False) -> None:
    """Refuse a size field that is not a whole number in 1..its limit, naming the field. ``none_allowed``
    (transformers configs): a field may be None (a default derived from others), or a non-empty list of such
    numbers, one per layer (Gemma3n's ``intermediate_size``)."""
    fields = vars(config)
    for field, limit in limits.items():
        value = fields.get(field)
        if field not in fields or (value is None and none_allowed):
            continue
        values = value if none_allowed and isinstance(value, list) and value else [value]
        if any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit for v in values):
            raise UserError(f"{source}: {field}={value!r} is out of range (a whole number from 1 to {limit:,})")


def parameters_on_meta(build: Callable[[], torch.nn.Module]) -> int:
    """The parameter count of the module ``build()`` makes, built on the meta device (allocating nothing)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def check_memory(parameters: int, bytes_per_parameter: float, source: str, purpose: str) -> None:
    """Refuse sizes whose parameters alone would not fit in the memory available now."""
    needed, available = parameters * bytes_per_parameter, psutil.virtual_memory().available
    if needed > available:
        raise UserError(
            f"{source}: the config's sizes imply {parameters:,} parameters, {needed / 2**30:,.1f} GiB {purpose}, "
            f"more than the {available / 2**30:,.1f} GiB of memory available"
        )
