"""What transformers does not make uniform across its dynamic families, declared as data.

``MOE_FAMILIES``: per mixture-of-experts ``model_type``, how its routers are named, which shape their output has,
the routing step of a router that returns only logits, its zero-computation experts, and how its decoder
layers are counted. It lists every MoE ``model_type`` of transformers' causal-LM mapping
(``tests/test_zoo_moe.py`` fails when transformers adds one it does not list); a family absent from it gets
``DEFAULT``: a ``gate`` or ``router`` child of a block that holds experts, returning ``(router_logits,
top_k_weights, top_k_index)``. Which controller kinds each family has, routers, SSMs and gates alike, is
``fca_workbench.adapters.classification``.
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
    something else.
    ``fixed_k``: the block takes exactly ``num_experts_per_tok`` experts per token, so a static profile is
    replayed as its top-k gates rather than as the mixture of every expert it names. ``classes``: the config field
    counting the routing classes where the router's logits are not one per class (product keys). ``experts``:
    the config field counting its routed experts, where ``fca export`` folds a static profile into the family's
    own architecture with K experts taken by every token (``fca_workbench.export.experts``); None: not folded."""

    router_names: tuple[str, ...] = ("gate", "router")
    output: str = "top_k"
    step: str | None = None
    zero_experts: int | str = 0
    layers: str | None = None
    fixed_k: bool = False
    classes: str | None = None
    experts: str | None = None


DEFAULT = Family()

MOE_FAMILIES: dict[str, Family] = {  # every MoE model type known to work; sorted
    "afmoe": DEFAULT,
    "aria_text": DEFAULT,
    "axk1": DEFAULT,
    "axk2": DEFAULT,
    "bailing_hybrid": DEFAULT,
    "beam": DEFAULT,
    "cohere2_moe": DEFAULT,
    "dbrx": Family(output="logits_step", step="route_tokens_to_experts"),
    "deepseek_v2": DEFAULT,
    "deepseek_v3": DEFAULT,
    "deepseek_v32": DEFAULT,
    "deepseek_v4": DEFAULT,
    "doge": Family(
        router_names=("router_gate",), output="product_keys", step="route_product_keys", classes="num_experts"
    ),
    "dots1": DEFAULT,
    "dots3_note": DEFAULT,
    "dots3_note_text": DEFAULT,
    "ergo": DEFAULT,
    "ernie4_5_moe": DEFAULT,
    "exaone_moe": DEFAULT,
    "flex_olmo": DEFAULT,
    "flint": DEFAULT,
    "gemma4": DEFAULT,
    "gemma4_text": DEFAULT,
    "glm4_moe": DEFAULT,
    "glm4_moe_lite": DEFAULT,
    "glm_moe_dsa": DEFAULT,
    "gpt_oss": DEFAULT,
    "granitemoe": DEFAULT,
    "granitemoe_swa": DEFAULT,
    "granitemoehybrid": DEFAULT,
    "granitemoeshared": Family(experts="num_local_experts"),  # top-k logits, then softmax
    "hunyuan_v1_moe": DEFAULT,
    "hy_v3": DEFAULT,
    "hy_v4": DEFAULT,
    "inkling2_loop_text": DEFAULT,
    "inkling2_text": DEFAULT,
    "inkling_text": Family(output="top_k_gammas"),
    "jamba": DEFAULT,
    "jetmoe": Family(output="sorted", fixed_k=True),
    "kimi_linear": DEFAULT,
    "kolibri1": DEFAULT,
    "kolibri1_1": DEFAULT,
    "laguna": DEFAULT,
    "lara_mini": DEFAULT,
    "lfm2_moe": DEFAULT,
    "llama4": Family(output="scores_logits"),
    "llama4_text": Family(output="scores_logits"),
    "longcat_flash": Family(zero_experts="zero_expert_num", layers="num_layers"),
    "mellum": DEFAULT,
    "mimo_v2_flash": DEFAULT,
    "minicpm5_moe": DEFAULT,
    "minimax": DEFAULT,
    "minimax_m2": DEFAULT,
    "minimax_m3_vl_text": DEFAULT,
    "mixtral": Family(experts="num_local_experts"),
    "nemotron_h": DEFAULT,
    "olmoe": Family(experts="num_experts"),
    "param2moe": DEFAULT,
    "phimoe": DEFAULT,
    "qwen2_moe": Family(experts="num_experts"),
    "qwen3_5_moe": DEFAULT,
    "qwen3_5_moe_text": DEFAULT,
    "qwen3_moe": Family(experts="num_experts"),
    "qwen3_next": DEFAULT,
    "qwen4_exp": DEFAULT,
    "qwen4_exp_text": DEFAULT,
    "sarvam_mla": DEFAULT,
    "sarvam_moe": DEFAULT,
    "solar_open": DEFAULT,
    "zaya": Family(output="skip_class", zero_experts=1),
}


# The kinds of selective SSMs and gates (``fca_workbench.adapters.selective`` finds them by role)
SELECTIVE_SSM = "selective_ssm"  # Δ, B, C of a Mamba-style selective scan
DELTA_RULE_GATE = "delta_rule_gate"  # the decay and β of a gated delta rule
ATTENTION_OUTPUT_GATE = "attention_output_gate"  # a sigmoid gate on softmax attention's output
LSTM_GATE = "lstm_gate"  # xLSTM's input and forget gate pre-activations
CONV_GATE = "conv_gate"  # LFM2's short-convolution input and output gates B, C
ALTUP_ROUTER = "altup_router"  # Gemma3n's AltUp prediction / correction coefficients
SELECTIVE_GATE = "selective_gate"  # RG-LRU's input and recurrence gates
DYNAMIC_CONV = "dynamic_conv"  # a short convolution's input-dependent kernel (Inkling2)
# found by the probe (``fca_workbench.adapters.gate_probe``), named by where they sit
HYPER_CONNECTION = "hyper_connection"  # a hyper-connection's input-dependent stream mixing weights
CROSS_LAYER_MIXING = "cross_layer_mixing"  # a learned query's weights over a stack of earlier layers' states
RECEPTANCE_GATE = "receptance_gate"  # RWKV's receptance
MIXING_WEIGHT = "mixing_weight"  # an exp of a projection weighting another branch in a sum it divides (RWKV's key)
DYNAMIC_MASK = "dynamic_mask"  # an input-dependent mask added to attention scores (Doge)
NORM_GATE = "norm_gate"  # a sigmoid gate on a norm's output (AXK2's gated norms)
INPUT_GATE = "input_gate"  # any other sigmoid / softmax / exp of a projection scaling another branch


# transformers' experts kernels that add a token's experts one at a time in the model's dtype, so that a
# zero-weight expert adds exactly nothing and a static mixture equal to the live routing replays it bit for bit;
# grouped_mm and batched_mm sum a token's slots (in float32): not so once k > 2 (docs/audit-json.md)
EXACT_MIXTURE_KERNELS = ("eager",)


def family_of(config: Any) -> Family:
    """The declared family of a model with this config, else ``DEFAULT``."""
    return MOE_FAMILIES.get(getattr(config, "model_type", ""), DEFAULT)


def zero_experts(family: Family, config: Any) -> int:
    """How many of the family's routing classes are zero-computation experts."""
    if isinstance(family.zero_experts, int):
        return family.zero_experts
    return int(getattr(config, family.zero_experts, 0) or 0)


OUTPUT_SHAPES = {  # Family.output → what the router returns (the docs' table)
    "top_k": "`(router_logits, top_k_weights, top_k_index)`",
    "top_k_gammas": "`(router_logits, top_k_weights, top_k_index, shared_gammas)`: the gammas join the coefficient",
    "scores_logits": "`(router_scores, router_logits)`: the scores are the dense gate",
    "sorted": "`(index_sorted_experts, batch_index, batch_gates, expert_size, logits)`, sorted by expert",
    "skip_class": "`(router_logits, probs, index, router_states)` over E + 1 classes, the last a skip",
    "logits_step": "logits only; the block's routing step turns them into `(top_k_weights, top_k_index)`",
    "product_keys": "product-key logits; the block's routing step (split out of its forward) gives the top-k",
}


def moe_table() -> str:
    """The Markdown table of every MoE family's routers, ``MOE_FAMILIES`` (docs/guides/foreign-models.md
    holds it between ``<!-- families -->`` markers; a test checks that the committed table is this one)."""
    rows = ["| model_type | MoE routers (child of the MoE block) | router output | notes |", "|---|---|---|---|"]
    for model_type, family in sorted(MOE_FAMILIES.items()):
        notes = []
        if family.step:
            notes.append(f"routing step `{family.step}` replaced with the router")
        if family.zero_experts:
            notes.append(f"zero-computation experts: `{family.zero_experts}`")
        if family.layers:
            notes.append(f"decoder layers counted by `{family.layers}`")
        if family.fixed_k:
            notes.append("static profiles replayed as their top-k")
        if family.experts:
            notes.append("`fca export` folds static profiles")
        routers = ", ".join(f"`{name}`" for name in family.router_names)
        output = f"`router:{family.output}`: {OUTPUT_SHAPES[family.output]}"
        rows.append(f"| `{model_type}` | {routers} | {output} | {'; '.join(notes)} |")
    return "\n".join(rows) + "\n"
