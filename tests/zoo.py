"""Tiny seeded models of every mixture-of-experts family of ``transformers``' causal-LM mapping, built from
their config classes (no network): 2 layers, width 64, 4 experts, top-2, the shipped tokenizer's vocabulary.

``SIZES`` sets every field a config class declares under one of its names; ``OVERRIDES`` holds what one
family needs besides (its own field names, or shapes its modelling code insists on).
"""

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
    "flint": {"mlp_only_layers": []},
    "longcat_flash": {"zero_expert_num": 2},
    "gemma4_text": {"enable_moe_block": True, "top_k_experts": TOP_K, "moe_intermediate_size": 32},
    "dots3_note_text": {"num_key_value_heads": 4},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 0},
    "zaya": {"num_experts_per_tok": 1},
}


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
        text = tiny_config(towers["text_config"].model_type).to_dict()
        small = {
            key: {name: value for name, value in SMALL_TOWER.items() if name in signature(tower)}
            for key, tower in towers.items()
            if key != "text_config"
        }
        return config_class(text_config=text, **small)
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


def save(model: torch.nn.Module, folder: Path, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
