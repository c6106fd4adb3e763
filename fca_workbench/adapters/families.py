"""What transformers does not make uniform across its mixture-of-experts families, declared as data: per
``model_type``, how its routers are named, which shape their output has, the routing step of a router that
returns only logits, its zero-computation experts, how its decoder layers are counted, and the text-only
causal LM of a multimodal model. A family absent from ``FAMILIES`` gets ``DEFAULT`` (a ``gate`` or
``router`` child of a block that holds experts, returning ``(router_logits, top_k_weights, top_k_index)``).
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """``router_names``: the child names a router has inside its sparse-MoE block. ``output``: the shape of
    its output (a key of ``fca_workbench.adapters.routers.OUTPUTS``). ``step``: for a logits-only router,
    the attribute of its block that turns the logits into ``(top_k_weights, top_k_index)``.
    ``zero_experts``: zero-computation routing classes (the last ones), a count or the config field holding
    it. ``layers``: the config field counting the decoder layers, where ``num_hidden_layers`` counts
    something else. ``text_model``: the transformers class of the text-only causal LM of a multimodal MoE.
    ``fixed_k``: the block takes exactly ``num_experts_per_tok`` experts per token, so a static profile is
    replayed as its top-k gates rather than as the mixture of every expert it names."""

    router_names: tuple[str, ...] = ("gate", "router")
    output: str = "top_k"
    step: str | None = None
    zero_experts: int | str = 0
    layers: str | None = None
    text_model: str | None = None
    fixed_k: bool = False


DEFAULT = Family()

FAMILIES: dict[str, Family] = {
    "dbrx": Family(output="logits_step", step="route_tokens_to_experts"),
    "inkling_text": Family(output="top_k_gammas"),
    "jetmoe": Family(output="sorted", fixed_k=True),  # its attention experts reshape by k
    "llama4": Family(output="scores_logits"),
    "llama4_text": Family(output="scores_logits"),
    "longcat_flash": Family(zero_experts="zero_expert_num", layers="num_layers"),
    "zaya": Family(output="skip_class", zero_experts=1),
}


def family_of(config: Any) -> Family:
    """The declared family of a model with this config, else ``DEFAULT``."""
    return FAMILIES.get(getattr(config, "model_type", ""), DEFAULT)


def zero_experts(family: Family, config: Any) -> int:
    """How many of the family's routing classes are zero-computation experts."""
    if isinstance(family.zero_experts, int):
        return family.zero_experts
    return int(getattr(config, family.zero_experts, 0) or 0)
