"""Every causal-LM family of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, classified, as data: the
controller kinds the adapter finds in it (``controller_kinds`` of its ``audit.json``), or ``static`` with
the reason it has none, and what it leaves out (``left_out``).

``tests/test_zoo_families.py`` enumerates the live mapping at collection time: a family transformers adds
fails until it is classified here, and every family the zoo can build tiny is built and its discovered kinds
asserted equal to these. ``python -m fca_workbench.adapters.family_table`` prints the docs'
table (docs/guides/families.md; a test keeps the two equal). At run time a ``model_type`` absent here gets
one line saying so and what discovery found (``classification_note``); the audit continues.
"""

from dataclasses import dataclass, replace

from fca_workbench.adapters.families import (
    ALTUP_ROUTER,
    ATTENTION_OUTPUT_GATE,
    CONV_GATE,
    CROSS_LAYER_MIXING,
    DELTA_RULE_GATE,
    DYNAMIC_CONV,
    DYNAMIC_MASK,
    HYPER_CONNECTION,
    LSTM_GATE,
    MIXING_WEIGHT,
    MOE_FAMILIES,
    NORM_GATE,
    RECEPTANCE_GATE,
    SELECTIVE_GATE,
    SELECTIVE_SSM,
)
from fca_workbench.foundation.errors import UserError

SHARED_EXPERT_GATE = "shared_expert_gate"  # ``fca_workbench.adapters.kinds.SHARED_EXPERT_GATE``'s name


@dataclass(frozen=True)
class Classified:
    """``kinds``: the controller kinds found (routers as ``router:OUTPUT``). ``static``: why a family with no
    kind has none. ``left_out``: what discovery finds and does not replay (``audit.json``'s ``left_out``).
    ``untested``: why the zoo cannot build it tiny (its kinds then come from the family it wraps)."""

    kinds: tuple[str, ...] = ()
    static: str = ""
    left_out: str = ""
    untested: str = ""


DENSE = Classified(
    static="attention and MLPs only: no module emits coefficients for another computation (a gated MLP's "
    "`act(gate_proj(x)) * up_proj(x)` is the layer's own nonlinearity)"
)
TWO_STREAMS = Classified(
    static="no controller it can replay: its relative-position logits, a projection of the hidden state, run "
    "once per stream (main and predict) in each layer, the predict stream's on ngram × T states",
    left_out="the relative-position projections, whose predict-stream output is not one row per token",
)
LSH = "attention and feed-forward only; LSH attention's buckets are its own sparsity, like a top-k of scores"
LANGUAGE = "attention and MLPs only; its language adapter is chosen by a language id, not by the hidden state"
WRAPPER = "audited as "
SLOW = "its default byte-hash embeddings take over a minute to build"
ANY_TEXT = "a multimodal wrapper around any text model (its text config is AutoConfig): audited as that family"
# DeepSeek-V3.2's DSA indexer and its kin (``gate_probe.learned_indexers`` names each one found)
INDEXER = (
    "a sparse-attention indexer: learned, input-dependent attention sparsity (the keys each token attends to, "
    "top-k indices over the sequence, not one coefficient row per token); it runs live"
)
AUDIO = "a text-to-audio decoder whose config needs its text and audio encoders'"


def router(model_type: str) -> str:
    """The kind name of the family's MoE routers (``fca_workbench.adapters.routers.router_kind``)."""
    return f"router:{MOE_FAMILIES[model_type].output if model_type in MOE_FAMILIES else 'top_k'}"


def untested(entry: Classified, reason: str) -> Classified:
    return replace(entry, untested=reason)


def gated(*kinds: str, **notes: str) -> Classified:
    return Classified(kinds=tuple(sorted(kinds)), **notes)


def moe(model_type: str, *kinds: str, **notes: str) -> tuple[str, Classified]:
    return model_type, gated(router(model_type), *kinds, **notes)


# fmt: off
CLASSIFIED: dict[str, Classified] = dict([
    moe("afmoe", ATTENTION_OUTPUT_GATE),
    ("apertus", DENSE),
    ("apertus1p5_text", DENSE),
    ("arcee", DENSE),
    moe("aria_text"),
    moe("axk1"),
    moe("axk2", ATTENTION_OUTPUT_GATE, NORM_GATE, left_out=INDEXER),
    moe("bailing_hybrid", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE),
    ("bamba", gated(SELECTIVE_SSM)),
    ("bart", DENSE),
    moe("beam", ATTENTION_OUTPUT_GATE),
    ("bert", DENSE),
    ("bert-generation", DENSE),
    ("big_bird", DENSE),
    ("bigbird_pegasus", DENSE),
    ("biogpt", DENSE),
    ("bitnet", DENSE),
    ("blenderbot", DENSE),
    ("blenderbot-small", DENSE),
    ("bloom", DENSE),
    ("blt", untested(DENSE, SLOW + "; its four sub-configs have no consistent tiny form")),
    ("camembert", DENSE),
    ("codegen", DENSE),
    ("cohere", DENSE),
    ("cohere2", DENSE),
    moe("cohere2_moe"),
    ("cohere_compass_text", untested(DENSE, "its config names no full_attention layer type the tiny build can give")),
    ("cpmant", DENSE),
    ("ctrl", DENSE),
    ("cwm", DENSE),
    ("data2vec-text", DENSE),
    moe("dbrx"),
    moe("deepseek_v2"),
    moe("deepseek_v3"),
    moe("deepseek_v32", left_out=INDEXER),
    moe("deepseek_v4", HYPER_CONNECTION),
    ("diffllama", DENSE),
    moe("doge", DYNAMIC_MASK),
    ("dory", gated(ATTENTION_OUTPUT_GATE)),  # in looped layers: one controller per call
    moe("dots1"),
    moe("dots3_note", ATTENTION_OUTPUT_GATE, left_out=INDEXER, untested=WRAPPER + "dots3_note_text; its vision tower's per-layer settings name layers a tiny tower lacks"),
    moe("dots3_note_text", ATTENTION_OUTPUT_GATE, left_out=INDEXER),
    ("electra", DENSE),
    ("emu3", DENSE),
    moe("ergo"),  # its residual gates are sigmoids of learned per-channel weights, the same for every token
    ("ernie", DENSE),
    ("ernie4_5", DENSE),
    moe("ernie4_5_moe"),
    ("exaone", DENSE),
    ("exaone4", DENSE),
    moe("exaone_moe"),
    ("falcon", DENSE),
    ("falcon_h1", gated(SELECTIVE_SSM)),
    ("falcon_mamba", gated(SELECTIVE_SSM)),
    moe("flex_olmo"),
    moe("flint"),
    ("fuyu", untested(DENSE, ANY_TEXT)),
    ("gemma", DENSE),
    ("gemma2", DENSE),
    ("gemma3", DENSE),
    ("gemma3_text", DENSE),
    ("gemma3n", gated(ALTUP_ROUTER, untested=WRAPPER + "gemma3n_text; its towers need timm, not installed")),
    ("gemma3n_text", gated(ALTUP_ROUTER)),
    moe("gemma4"),
    ("gemma4_assistant", untested(DENSE, ANY_TEXT)),
    moe("gemma4_text"),
    ("gemma4_unified", DENSE),
    ("gemma4_unified_assistant", untested(DENSE, ANY_TEXT)),
    ("gemma4_unified_text", DENSE),
    ("git", DENSE),
    ("glm", DENSE),
    ("glm4", DENSE),
    moe("glm4_moe"),
    moe("glm4_moe_lite"),
    moe("glm_moe_dsa", left_out=INDEXER),
    ("got_ocr2", untested(DENSE, ANY_TEXT)),
    ("gpt-sw3", DENSE),
    ("gpt2", DENSE),
    ("gpt_bigcode", DENSE),
    ("gpt_neo", DENSE),
    ("gpt_neox", DENSE),
    ("gpt_neox_japanese", DENSE),
    moe("gpt_oss"),
    ("gptj", DENSE),
    ("granite", DENSE),
    ("granite_swa", DENSE),
    moe("granitemoe"),
    moe("granitemoe_swa"),
    moe("granitemoehybrid", SELECTIVE_SSM),
    moe("granitemoeshared"),
    ("helium", DENSE),
    ("hrm_text", gated(ATTENTION_OUTPUT_GATE)),  # in looped layers: one controller per call
    ("hunyuan_v1_dense", DENSE),
    moe("hunyuan_v1_moe"),
    moe("hy_v3"),
    moe("hy_v4", ATTENTION_OUTPUT_GATE, HYPER_CONNECTION, left_out=INDEXER),
    ("hyperclovax", DENSE),
    moe("inkling2_loop_text", ATTENTION_OUTPUT_GATE, CROSS_LAYER_MIXING, DYNAMIC_CONV),
    moe("inkling2_text", ATTENTION_OUTPUT_GATE, CROSS_LAYER_MIXING, DYNAMIC_CONV),
    moe("inkling_text"),
    ("internlm3", DENSE),
    ("iquestcoder", DENSE),
    ("jais2", DENSE),
    moe("jamba", SELECTIVE_SSM),
    moe("jetmoe"),
    moe("kimi_linear", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE),
    moe("kolibri1"),
    moe("kolibri1_1"),  # its indexer has no weights: a top-k of its layer's own query-key scores, as LSH buckets
    moe("laguna", ATTENTION_OUTPUT_GATE),
    moe("lara_mini", DELTA_RULE_GATE),
    ("lfm2", gated(CONV_GATE)),
    moe("lfm2_moe", CONV_GATE),
    ("lfm3", gated(CONV_GATE)),
    ("llama", DENSE),
    moe("llama4"),
    moe("llama4_text"),
    moe("longcat_flash"),
    ("mamba", gated(SELECTIVE_SSM)),
    ("mamba2", gated(SELECTIVE_SSM)),
    ("marian", DENSE),
    ("mbart", DENSE),
    ("megatron-bert", DENSE),
    moe("mellum"),
    moe("mimo_v2_flash"),
    ("minicpm3", DENSE),
    moe("minicpm5_moe", ATTENTION_OUTPUT_GATE),
    moe("minimax", ATTENTION_OUTPUT_GATE),
    moe("minimax_m2"),
    moe("minimax_m3_vl_text"),
    ("ministral", DENSE),
    ("ministral3", DENSE),
    ("mistral", DENSE),
    moe("mixtral"),
    ("mllama", DENSE),
    ("modernbert-decoder", DENSE),
    ("moshi", DENSE),
    ("moss_transcribe_diarize", untested(DENSE, ANY_TEXT)),
    ("mpt", DENSE),
    ("musicgen", untested(DENSE, AUDIO)),
    ("musicgen_melody", untested(DENSE, AUDIO)),
    ("mvp", DENSE),
    ("nanochat", DENSE),
    ("nemotron", DENSE),
    ("nemotron_h", gated(SELECTIVE_SSM)),
    ("olmo", DENSE),
    ("olmo2", DENSE),
    ("olmo3", DENSE),
    ("olmo_hybrid", gated(DELTA_RULE_GATE)),
    moe("olmoe"),
    ("openai-gpt", DENSE),
    ("opt", DENSE),
    moe("param2moe"),  # GLM-4-MoE's modelling under its own config
    ("pegasus", DENSE),
    ("persimmon", DENSE),
    ("phi", DENSE),
    ("phi3", DENSE),
    ("phi4_multimodal", DENSE),
    moe("phimoe"),
    ("plbart", DENSE),
    ("prophetnet", TWO_STREAMS),
    ("qwen2", DENSE),
    moe("qwen2_moe", SHARED_EXPERT_GATE),
    ("qwen3", DENSE),
    ("qwen3_5", gated(ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE)),
    moe("qwen3_5_moe", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE, SHARED_EXPERT_GATE),
    moe("qwen3_5_moe_text", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE, SHARED_EXPERT_GATE),
    ("qwen3_5_text", gated(ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE)),
    moe("qwen3_moe"),
    moe("qwen3_next", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE, SHARED_EXPERT_GATE),
    moe("qwen4_exp", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE, HYPER_CONNECTION, SHARED_EXPERT_GATE, left_out=INDEXER),
    moe("qwen4_exp_text", ATTENTION_OUTPUT_GATE, DELTA_RULE_GATE, HYPER_CONNECTION, SHARED_EXPERT_GATE, left_out=INDEXER),
    ("recurrent_gemma", gated(SELECTIVE_GATE)),
    ("reformer", untested(Classified(static=LSH), "its LM head needs is_decoder and axial position shapes of the sequence")),
    ("rembert", DENSE),
    ("roberta", DENSE),
    ("roberta-prelayernorm", DENSE),
    ("roc_bert", DENSE),
    ("roformer", DENSE),
    ("rwkv", gated(RECEPTANCE_GATE, MIXING_WEIGHT)),
    moe("sarvam_mla"),
    moe("sarvam_moe"),
    ("seed_oss", DENSE),
    ("smollm3", DENSE),
    moe("solar_open"),
    ("stablelm", DENSE),
    ("starcoder2", DENSE),
    ("trocr", DENSE),
    ("vaultgemma", DENSE),
    ("whisper", DENSE),
    ("xglm", DENSE),
    ("xlm", DENSE),
    ("xlm-roberta", DENSE),
    ("xlm-roberta-xl", DENSE),
    ("xlnet", DENSE),
    ("xlstm", gated(LSTM_GATE)),
    ("xmod", untested(Classified(static=LANGUAGE), "its forward needs a default language set")),
    ("youtu", DENSE),
    ("zamba", gated(SELECTIVE_SSM)),
    ("zamba2", gated(SELECTIVE_SSM)),
    moe("zaya"),
])
# fmt: on


def check_classified_kinds(model_type: str, kinds: list[str]) -> None:
    """A family classified with gates or SSMs in which discovery finds none of them (a version of
    transformers that changed its modules) is a one-line error, never an audit that says it has none."""
    declared = (
        [kind for kind in CLASSIFIED[model_type].kinds if not kind.startswith("router:")]
        if model_type in CLASSIFIED
        else []
    )
    if declared and not set(declared) & set(kinds):
        raise UserError(
            f"no {'/'.join(declared)} controller found in this {model_type} model (its modules are not the ones "
            "the adapter knows); name its controllers with --only-controllers REGEX"
        )


def classification_note(model_type: str, kinds: list[str], left_out: list[str]) -> str | None:
    """One line for a ``model_type`` the classification does not know (what discovery found), else None."""
    if model_type in CLASSIFIED:
        return None
    found = ", ".join(sorted(set(kinds))) or "no controller"
    out = f"; {len(left_out)} left out" if left_out else ""
    return (
        f"model_type '{model_type}' is not in fca_workbench's family classification "
        f"(fca_workbench/adapters/classification.py); discovery found: {found}{out}"
    )


def family_table() -> str:
    """The docs' Markdown table of every classified family (between ``<!-- classification -->`` markers
    in docs/guides/families.md)."""
    rows = ["| model_type | controller kinds | notes |", "|---|---|---|"]
    for model_type, entry in sorted(CLASSIFIED.items()):
        kinds = ", ".join(f"`{kind}`" for kind in entry.kinds) or "static"
        notes = [entry.static, f"left out: {entry.left_out}" if entry.left_out else ""]
        notes.append(f"not built tiny: {entry.untested}" if entry.untested else "")
        rows.append(f"| `{model_type}` | {kinds} | {'; '.join(note for note in notes if note)} |")
    return "\n".join(rows) + "\n"
