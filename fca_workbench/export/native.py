"""The workbench families with a static profile folded into their weights.

FeatureGate: a block computes ``h + g_attn ⊙ c_proj(attn)`` and ``h + g_mlp ⊙ c_proj(mlp)`` with per-group
gates; a constant gate scales the rows of each ``c_proj`` (weight and bias), which leaves a Dense model, and
Dense (a pre-LayerNorm GPT: exact GELU, biases, learned positions, tied head) is GPT-2's architecture, so it
is written as a ``gpt2`` folder that plain transformers loads. MUDDPythia: the static coefficients become
``dense_bs`` of a MUDDPythia with ``dynamic_dense=False`` (a static cross-layer model).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from fca_workbench.models.featuregate import FeatureGateForCausalLM, expand_groups
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM

ATTN, MLP = 0, 1  # the rows of a FeatureGate coefficient [2, G]


def featuregate_to_gpt2(model: FeatureGateForCausalLM, gates: list[torch.Tensor]) -> GPT2LMHeadModel:
    """A GPT-2 with the FeatureGate's weights, each block's constant gates ``[2, G]`` folded into its two
    residual projections (``expand_groups`` to channels, as the block applies them). With a
    ``skip_threshold``, an MLP whose gates all fall below it is skipped for every token: its gate is 0."""
    config = model.config
    width = config.n_embd
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=config.vocab_size,
            n_positions=config.block_size,
            n_embd=width,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_inner=config.mlp_ratio * width,
            activation_function="gelu",  # exact (erf), as Dense's F.gelu
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,  # nn.LayerNorm's default, Dense's
            tie_word_embeddings=config.tie_word_embeddings,
            bos_token_id=getattr(config, "bos_token_id", None),
            eos_token_id=getattr(config, "eos_token_id", None),
        )
    )
    source = model.state_dict()
    state = {"transformer.wte.weight": source["wte.weight"], "transformer.wpe.weight": source["wpe.weight"]}
    state.update({f"transformer.ln_f.{p}": source[f"ln_f.{p}"] for p in ("weight", "bias")})
    state["lm_head.weight"] = source["lm_head.weight"]
    for layer, gate in enumerate(gates):
        gate = gate.to(source["wte.weight"].dtype)
        if config.skip_threshold is not None and float(gate[MLP].amax()) < config.skip_threshold:
            gate = torch.stack([gate[ATTN], torch.zeros_like(gate[MLP])])
        scales = {"attn.c_proj": expand_groups(gate[ATTN], width), "mlp.c_proj": expand_groups(gate[MLP], width)}
        for name in ("ln_1", "ln_2"):
            for p in ("weight", "bias"):
                state[f"transformer.h.{layer}.{name}.{p}"] = source[f"h.{layer}.{name}.{p}"]
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            weight, bias = source[f"h.{layer}.{name}.weight"], source[f"h.{layer}.{name}.bias"]
            scale = scales.get(name)
            if scale is not None:  # the output rows of a residual projection
                weight, bias = weight * scale[:, None], bias * scale
            state[f"transformer.h.{layer}.{name}.weight"] = weight.t().contiguous()  # Conv1D: [in, out]
            state[f"transformer.h.{layer}.{name}.bias"] = bias
    gpt2.load_state_dict(state, strict=False)
    check_all_loaded(gpt2, state)
    return gpt2.to(source["wte.weight"].dtype).eval()


def check_all_loaded(model: PreTrainedModel, state: dict[str, torch.Tensor]) -> None:
    """Every parameter of ``model`` came from ``state`` (the tied head aside): nothing left at its init."""
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"export left parameters unset: {sorted(missing)[:4]}")


def muddpythia_static(model: MUDDPythiaForCausalLM, coefficients: list[torch.Tensor]) -> MUDDPythiaForCausalLM:
    """The same MUDDPythia without ``dynamic_dense``, the static coefficients ``[C, L]`` as its ``dense_bs``."""
    fields = model.config.to_dict()
    fields["dynamic_dense"] = False
    static = MUDDPythiaForCausalLM(MUDDPythiaConfig(**fields))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("dynamic_dense.")}
    dtype = model.dense_bs[0].dtype
    state.update({f"dense_bs.{i}": c.to(dtype) for i, c in enumerate(coefficients)})
    static.load_state_dict(state, strict=True)
    return static.to(dtype).eval()
