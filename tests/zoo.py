"""Tiny seeded models of every mixture-of-experts family of ``transformers``' causal-LM mapping, built from
their config classes (no network): 2 layers, width 64, 4 experts, top-2, the shipped tokenizer's vocabulary.

``SIZES`` sets every field a config class declares under one of its names; ``OVERRIDES`` holds what one
family needs besides (its own field names, or shapes its modelling code insists on).
"""

import functools
import inspect
import re
from pathlib import Path

import torch
import transformers as T
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from fca_workbench.adapters.routers import find_routers

EXPERT_COUNT = re.compile(r"^(num|n|moe_num)_(local_|routed_)?experts$")
VOCAB = 4096  # the shipped tokenizer's
EXPERTS, TOP_K = 4, 2
ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "vocab_size": VOCAB,
    "unpadded_vocab_size": VOCAB,  # Inkling-2 saves its unembedding padded to vocab_size
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "ffn_hidden_size": 64,
    "moe_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_experts": EXPERTS,
    "num_local_experts": EXPERTS,
    "n_routed_experts": EXPERTS,
    "moe_num_experts": EXPERTS,
    "num_experts_per_tok": TOP_K,
    "moe_topk": TOP_K,
    "moe_k": TOP_K,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "max_position_embeddings": 128,
    # the linear-attention and SSM layers of hybrids: small heads and states (their reference kernels are slow)
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_d_state": 16,
    "mamba_chunk_size": 32,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "n_groups": 1,
    "chunk_size": 32,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
OVERRIDES: dict[str, dict] = {  # multi-head latent attention with an indexer: as many key/value heads as heads
    **{t: {"num_key_value_heads": 4} for t in ("axk2", "deepseek_v32", "glm_moe_dsa")},
    "afmoe": {"num_dense_layers": 0},
    "beam": {"mlp_layer_types": ["sparse", "sparse"]},
    "dbrx": {
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "max_seq_len": 128,
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},  # DbrxAttention reads it
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": EXPERTS, "moe_top_k": TOP_K},
    },
    "deepseek_v4": {"mlp_layer_types": ["hash_moe", "moe"]},  # a hash-routed layer (token id → experts), a learned one
    "doge": {"is_moe": True, "num_experts": 16, "num_experts_per_tok": TOP_K},  # product keys: a square E
    # an input layer that runs once, one recurrent layer looped twice, an output layer: Dory's layout, tiny
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1, "n_recurrent_loops": 2},
    "flint": {"mlp_only_layers": []},
    "longcat_flash": {"zero_expert_num": 2},
    # a sliding layer and an indexed one, both sparse (its defaults: a dense MLP in the first two layers, an
    # indexed layer every fifth, 12 scoring heads of a key head's 12 query heads); an indexer budget small
    # enough that an 8-token query already attends to a selection of its keys
    "kolibri1_1": {
        "layer_types": ["sliding_attention", "indexed_attention"],
        "mlp_only_layers": [],
        **dict(index_num_heads=2, index_topk=2, index_pool_size=4, index_compression=2),
        **dict(index_num_local_tokens=2, index_num_sink_tokens=1),
    },
    "gemma4_text": {"enable_moe_block": True, "top_k_experts": TOP_K, "moe_intermediate_size": 32},
    "dots3_note_text": {"num_key_value_heads": 4},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 0},
    "zaya": {"num_experts_per_tok": 1},
    # a full-attention layer beside the linear one, as the released models have (its output gate)
    "qwen3_5_moe_text": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen4_exp_text": {
        "layer_types": ["linear_attention", "full_attention"],
        **dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=2),
    },
    **{t: {"rotary_dim": 8} for t in ("codegen", "gptj")},  # within a 16-wide head
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # a full ("hybrid") layer beside the sliding one, as every sixth layer of the released models: its
    # key / value projections' dynamic convolutions
    **{t: {"layer_types": ["hybrid_sliding", "hybrid"]} for t in ("inkling2_text", "inkling2_loop_text")},
    "gemma3": {  # its vision tower is any config: a one-layer SigLIP
        "vision_config": dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
    },
}


@functools.cache
def moe_model_types() -> list[str]:
    """The model types of the causal-LM mapping that hold experts: a config (or sub-config) field counting
    experts, or a modelling module that defines an experts class or assigns ``self.experts``."""
    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t in CONFIG_MAPPING and holds_experts(t))


def signature(config_class) -> set[str]:
    return set(inspect.signature(config_class.__init__).parameters)


def holds_experts(model_type: str) -> bool:
    config_class = CONFIG_MAPPING[model_type]
    classes = [config_class, *(getattr(config_class, "sub_configs", None) or {}).values()]
    if any(EXPERT_COUNT.search(name) for c in classes for name in inspect.signature(c.__init__).parameters):
        return True
    causal = getattr(T, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type], None)
    source = Path(inspect.getfile(causal)).read_text() if causal is not None else ""
    return re.search(r"class \w+Experts\(|self\.experts\s*=", source) is not None


def routed_experts(model_type: str) -> int:
    """The E of the family's tiny build."""
    return OVERRIDES.get(model_type, {}).get("num_experts", EXPERTS)


def routed_k(model_type: str) -> int:
    """The k of the family's tiny build."""
    return OVERRIDES.get(model_type, {}).get("num_experts_per_tok", TOP_K)


SMALL_TOWER = {  # the vision / audio towers of a multimodal MoE: one small layer
    "depth": 1,
    "num_hidden_layers": 1,
    "num_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_heads": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "out_hidden_size": 64,
}


def tiny_config(model_type: str):
    config_class = CONFIG_MAPPING[model_type]
    towers = getattr(config_class, "sub_configs", None) or {}
    if "text_config" in towers:  # a multimodal MoE: its text model's tiny config, small towers
        text_type = towers["text_config"].model_type
        text = (gated_config(text_type) if text_type in GATED else tiny_config(text_type)).to_dict()
        small = {
            key: {name: value for name, value in SMALL_TOWER.items() if name in signature(tower)}
            for key, tower in towers.items()
            if key != "text_config"
        }
        return config_class(text_config=text, **{**small, **OVERRIDES.get(model_type, {})})
    names = signature(config_class)
    fields = {name: value for name, value in SIZES.items() if name in names}
    if "mlp_layer_types" in names:  # every layer sparse
        fields["mlp_layer_types"] = ["sparse"] * 2
    if "qk_rope_head_dim" in names and "head_dim" in names:  # multi-head latent attention: rope width
        fields["head_dim"] = fields["qk_rope_head_dim"]
    return config_class(**{**fields, **OVERRIDES.get(model_type, {})})


def build(model_type: str, seed: int = 0, router_scale: float = 20.0) -> torch.nn.Module:
    """A seeded tiny model; its routers' weights scaled so that routing depends on the input (a randomly
    initialised router is nearly uniform, a zero-initialised one constant)."""
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    with torch.no_grad():
        for name in find_routers(model):
            for parameter in model.get_submodule(name).parameters():
                if parameter.dim() > 1:
                    if not parameter.any():  # a router initialised to zeros (AFMoE's) routes every token alike
                        parameter.normal_(0.0, 0.02)
                    parameter.mul_(router_scale)
    return model


COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
ATTENTION = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LINEAR_ATTENTION = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    layer_types=["linear_attention", "full_attention"],
)
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, moe_intermediate_size=32)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16)
GATED = {  # model_type: (config class, its fields beyond COMMON): the gated and SSM families' own shapes
    "mamba": (T.MambaConfig, dict(state_size=8, expand=2, time_step_rank=8)),
    "falcon_mamba": (T.FalconMambaConfig, dict(state_size=8, expand=2, time_step_rank=8)),
    "mamba2": (T.Mamba2Config, dict(state_size=8, expand=2, num_heads=8, head_dim=16, n_groups=1, chunk_size=16)),
    "bamba": (T.BambaConfig, dict(**ATTENTION, **MAMBA2, intermediate_size=64, attn_layer_indices=[1])),
    "falcon_h1": (T.FalconH1Config, dict(**ATTENTION, **MAMBA2, intermediate_size=64, head_dim=16, mamba_d_ssm=128)),
    "zamba": (
        T.ZambaConfig,
        dict(
            **ATTENTION,
            intermediate_size=64,
            mamba_d_state=8,
            n_mamba_heads=2,
            num_hidden_layers=3,
            layers_block_type=["mamba", "hybrid", "hybrid"],
        ),
    ),
    "zamba2": (
        T.Zamba2Config,
        dict(
            **ATTENTION,
            mamba_d_state=8,
            mamba_headdim=16,
            n_mamba_heads=8,
            mamba_ngroups=1,
            chunk_size=16,
            layers_block_type=["mamba", "hybrid"],
            hybrid_layer_ids=[1],
            num_mem_blocks=1,
        ),
    ),
    "nemotron_h": (
        T.NemotronHConfig,
        dict(
            **ATTENTION,
            intermediate_size=64,
            head_dim=16,
            mamba_num_heads=8,
            mamba_head_dim=16,
            ssm_state_size=8,
            n_groups=1,
            chunk_size=16,
            layers_block_type=["mamba", "attention"],
        ),
    ),
    "granitemoehybrid": (
        T.GraniteMoeHybridConfig,
        dict(
            **ATTENTION,
            **MAMBA2,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["mamba", "attention"],
        ),
    ),
    "jamba": (
        T.JambaConfig,
        dict(
            **ATTENTION,
            intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=1,
            expert_layer_offset=0,
            mamba_d_state=8,
            mamba_dt_rank=8,
        ),
    ),
    "qwen3_next": (
        T.Qwen3NextConfig,
        dict(
            **ATTENTION,
            **LINEAR_ATTENTION,
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            head_dim=16,
        ),
    ),
    "qwen3_5_text": (T.Qwen3_5TextConfig, dict(**ATTENTION, **LINEAR_ATTENTION, intermediate_size=64, head_dim=16)),
    "olmo_hybrid": (T.OlmoHybridConfig, dict(**ATTENTION, **LINEAR_ATTENTION, intermediate_size=64)),
    "kimi_linear": (
        T.KimiLinearConfig,
        dict(
            **ATTENTION,
            **MLA,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            linear_head_dim=16,
            linear_num_heads=4,
            layer_types=["linear_attention", "full_attention"],
        ),
    ),
    "bailing_hybrid": (
        T.BailingHybridConfig,
        dict(
            **ATTENTION,
            **MLA,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            head_dim=16,
            linear_head_dim=16,
            linear_num_heads=4,
            layer_group_size=2,
            num_mtp_layers=0,
        ),
    ),
    "xlstm": (T.xLSTMConfig, dict(embedding_dim=64, num_heads=4, num_blocks=2, qk_dim_factor=0.5, chunk_size=16)),
    "lfm2": (T.Lfm2Config, dict(**ATTENTION, intermediate_size=64, layer_types=["conv", "full_attention"])),
    "recurrent_gemma": (
        T.RecurrentGemmaConfig,
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=64,
            lru_width=64,
            block_types=["recurrent", "attention"],
        ),
    ),
    "gemma3n_text": (
        T.Gemma3nTextConfig,
        dict(
            **ATTENTION,
            intermediate_size=64,
            head_dim=16,
            altup_num_inputs=2,
            laurel_rank=8,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=0,
            layer_types=["sliding_attention", "full_attention"],
            activation_sparsity_pattern=[0.0, 0.0],
        ),
    ),
}


def build_gated(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A seeded tiny model whose weights are all random (a zero-initialised gate, like xLSTM's, would
    make every token's gate equal, and no reassignment could move anything)."""
    torch.manual_seed(seed)
    return randomized(T.AutoModelForCausalLM.from_config(gated_config(model_type)).eval())


def gated_config(model_type: str):
    config_class, fields = GATED[model_type]
    return config_class(**{**COMMON, **fields})


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Every zero-initialised matrix made random (its gate would be constant otherwise)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and param.std() == 0:
                param.normal_(0.0, 0.2)
    return model


# the decoders of encoder-decoder and older families name their sizes otherwise
DECODER_SIZES = dict(
    d_model=64,
    decoder_layers=2,
    encoder_layers=2,
    decoder_attention_heads=4,
    encoder_attention_heads=4,
    decoder_ffn_dim=64,
    encoder_ffn_dim=64,
    n_embd=64,
    n_layer=2,
    n_head=4,
    n_layers=2,
    n_heads=4,
    dim=64,
    hidden_dim=64,
    ffn_dim=64,
    n_inner=64,
    num_decoder_layers=2,
    d_ff=64,
    d_kv=16,
    embed_dim=64,
    word_embed_proj_dim=64,
    emb_dim=64,
)


def build_any(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A seeded tiny model of any family of the causal-LM mapping: the gated families from their own shapes
    (``GATED``), mixture-of-experts families as ``build``, any other from ``SIZES`` and ``DECODER_SIZES``."""
    if model_type in GATED:
        return build_gated(model_type, seed)
    if model_type in moe_model_types():
        return build(model_type, seed)
    config_class = CONFIG_MAPPING[model_type]
    if "text_config" in (getattr(config_class, "sub_configs", None) or {}):  # a multimodal wrapper
        config = tiny_config(model_type)
    else:
        names = signature(config_class)
        fields = {name: value for name, value in {**SIZES, **DECODER_SIZES}.items() if name in names}
        config = config_class(**{**fields, **small_towers(config_class), **OVERRIDES.get(model_type, {})})
    torch.manual_seed(seed)
    return randomized(T.AutoModelForCausalLM.from_config(config).eval())


def small_towers(config_class) -> dict:
    """The vision / audio towers of a multimodal model without a text config: one small layer each."""
    towers = getattr(config_class, "sub_configs", None) or {}
    return {
        key: {name: value for name, value in SMALL_TOWER.items() if name in signature(tower)}
        for key, tower in towers.items()
    }


def save(model: torch.nn.Module, folder: Path, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
