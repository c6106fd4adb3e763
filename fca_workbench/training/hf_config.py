"""The transformers configs ``fca train --hf-config`` can train, and the model built from one.

Any built-in ``transformers`` causal-LM config: it is built with ``AutoConfig.for_model`` and
``AutoModelForCausalLM.from_config``, so no code from anywhere but the installed ``transformers`` ever runs. What
the workbench cannot train is refused in one line before anything is written: a model type without a causal LM,
a size out of range, an attention implementation or an activation that transformers' own registries
(``ALL_ATTENTION_FUNCTIONS``, ``ACT2FN``) do not hold or whose package is missing, a dtype other than float32 or
bfloat16 (float16 needs the loss scaling ``fca train`` does not do), a model too big for memory, and a model
that is not causal: the mapping names ``BertLMHeadModel`` for ``bert``, which sees later tokens unless it is a
decoder, so the built model is probed (a later token never changes an earlier position's logits).
"""

from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.activations import ACT2FN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from fca_workbench.adapters.controlled import NATIVE_MODEL_TYPES, load_transformers
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.foundation.checkpoint import (
    CONFIG_FILE,
    check_checkpoint,
    config_fields,
    hub_requests,
    model_type_of,
)
from fca_workbench.foundation.errors import UserError, one_line
from fca_workbench.foundation.files import read_json, reading
from fca_workbench.models.limits import (
    HF_SIZE_LIMITS,
    check_fields,
    check_memory,
    check_sizes,
    on_meta,
)

TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments
TRAINABLE_DTYPES = ("float32", "bfloat16")
EAGER = "eager"  # transformers' own attention, the one implementation outside ALL_ATTENTION_FUNCTIONS
ATTENTION_FIELDS = ("attn_implementation", "_attn_implementation")
ACTIVATION_FIELDS = ("hidden_act", "hidden_activation", "activation_function")  # the names families use
CAUSAL_PROBE_TOKENS = 16
CAUSAL_TOLERANCE = 1e-5  # logits of a causal model do not move at all; an encoder's move by ~1e-4 at init


def read_hf_config(path: str | Path) -> dict:
    """The fields of a transformers config JSON file; one that names remote code is refused. Training from a
    local file makes no request (``hub_requests``)."""
    hub_requests(False)
    path = Path(path)
    if not path.exists():
        raise UserError(f"no config file {path}")
    fields = read_json(path, expect=None)
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise UserError(f'{path} is not a transformers config: it needs a JSON object with a "model_type"')
    if "auto_map" in fields:
        raise UserError(f"{path} names remote code (auto_map); only transformers' built-in model types can be trained")
    if fields["model_type"] not in CONFIG_MAPPING:
        raise UserError(f"{path}: unknown model_type '{fields['model_type']}' in this transformers")
    if fields["model_type"] not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(f"{path}: model_type '{fields['model_type']}' has no causal language model in transformers")
    return fields


def check_trainable_fields(fields: dict) -> None:
    """Refuse the attention implementation, activation and dtype fields ``fca train`` cannot train with."""
    for name in ATTENTION_FIELDS:
        value = fields.get(name)
        if value is not None and (not isinstance(value, str) or value not in [EAGER, *ALL_ATTENTION_FUNCTIONS]):
            known = ", ".join([EAGER, *ALL_ATTENTION_FUNCTIONS.valid_keys()])
            raise UserError(f"{name} {str(value)[:60]!r} is not an attention implementation of transformers ({known})")
    for name in ACTIVATION_FIELDS:
        value = fields.get(name)
        if value is not None and (not isinstance(value, str) or value not in ACT2FN):
            raise UserError(f"{name} {str(value)[:60]!r} is not an activation of transformers ({', '.join(ACT2FN)})")
    for name in ("dtype", "torch_dtype"):
        value = fields.get(name)
        if value is not None and value not in TRAINABLE_DTYPES:
            raise UserError(
                f"{name} {str(value)[:60]!r}: fca train trains {' or '.join(TRAINABLE_DTYPES)} "
                "(float16 would need loss scaling)"
            )


def from_config(config: object, what: str) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_config``, with what it refuses (a missing attention package, a field that
    does not fit the family) as one line."""
    try:
        return AutoModelForCausalLM.from_config(config)
    except (ImportError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{what}: transformers cannot build it: {one_line(exc)}") from None


def build_hf_model(fields: dict, tokenizer: PreTrainedTokenizerBase, window: int) -> PreTrainedModel:
    """A transformers causal LM from config fields (see read_hf_config), sized to the shipped tokenizer,
    checked to be one ``fca train`` can train (the module's docstring).

    Vocabulary size and special-token ids default to the tokenizer's; its pad id is None, so no real
    token's embedding row is frozen as padding (some families default ``pad_token_id`` to 1).
    """
    defaults = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    model_type = fields["model_type"]
    given = {k: v for k, v in fields.items() if k != "model_type"}
    what = "fca train's --hf-config"
    check_fields(given, CONFIG_MAPPING[model_type], what, HF_SIZE_LIMITS, none_allowed=True)
    check_trainable_fields(given)
    try:
        config = AutoConfig.for_model(model_type, **{**defaults, **given})
    except (StrictDataclassError, ValueError, TypeError) as exc:
        raise UserError(f"invalid {model_type} config: {one_line(exc)}") from None
    check_sizes(config, what, HF_SIZE_LIMITS, none_allowed=True)
    check_fits(config, tokenizer, window)
    check_training_memory(lambda: from_config(config, what))
    model = from_config(config, what)
    check_causal(model, min(window, CAUSAL_PROBE_TOKENS))
    return model


def check_fits(config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase, window: int) -> None:
    """Refuse a config whose vocabulary is smaller than the tokenizer's or whose positions end before the window."""
    vocab_size, positions = config.vocab_size, getattr(config, "max_position_embeddings", window)
    if vocab_size < len(tokenizer):
        raise UserError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    if positions < window:
        raise UserError(f"max_position_embeddings {positions} is shorter than the window {window}")


def read_init_config(folder: str | Path) -> dict:
    """The config fields of an ``--init`` checkpoint: a folder holding a transformers causal LM's config (a
    workbench family's folder is refused: its controllers train with ``--arch``)."""
    try:
        folder = check_checkpoint(folder)
    except UserError as exc:
        raise UserError(f"--init: {exc}") from None
    model_type = model_type_of(config_fields(folder), folder)
    if model_type in NATIVE_MODEL_TYPES:
        raise UserError(
            f"--init {folder} is a workbench {model_type} model; --init starts from a transformers causal LM"
        )
    fields = read_hf_config(folder / CONFIG_FILE)
    check_trainable_fields(fields)
    return fields


def load_initial(folder: str | Path, tokenizer: PreTrainedTokenizerBase, window: int) -> PreTrainedModel:
    """The ``--init`` checkpoint in float32 (safetensors only, no code from the folder), checked as a model built
    from a config is (sizes, memory, causal), with the tokenizer the run trains with: the shipped one."""
    folder = Path(folder)
    model: PreTrainedModel = load_transformers(folder, read_init_config(folder), torch.float32, False)  # type: ignore[assignment]
    check_fits(model.config, tokenizer, window)
    if load_tokenizer(folder).get_vocab() != tokenizer.get_vocab():
        raise UserError(f"--init {folder} has another tokenizer than the shipped one fca train trains with")
    check_training_memory(lambda: from_config(model.config, f"--init {folder}"))
    check_causal(model, min(window, CAUSAL_PROBE_TOKENS))
    return model


def check_causal(model: PreTrainedModel, tokens: int) -> None:
    """Refuse a model whose logits at a position move when a later token changes: it is not a causal LM, and
    its NLL would not be a causal LM's. The probe draws from its own generator (the global seed is untouched)."""
    generator = torch.Generator().manual_seed(0)
    probe = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)
    changed = probe.clone()
    changed[0, -1] = (probe[0, -1] + 1) % model.config.vocab_size
    training = model.training
    model.eval()
    what = f"a {model.config.model_type} model built from this config cannot run the causal probe's forward"
    with torch.no_grad(), reading(what, "fca train trains causal language models"):  # its own exception types
        moved = (model(probe).logits[0, :-1] - model(changed).logits[0, :-1]).abs().max().item()
    model.train(training)
    if not moved <= CAUSAL_TOLERANCE:  # NaN included
        raise UserError(
            f"a {model.config.model_type} model built from this config is not causal: changing token {tokens - 1} "
            f"moves the logits of earlier positions by up to {moved:.3g}; fca train trains causal language models"
            + (" (set is_decoder: true)" if getattr(model.config, "is_decoder", None) is False else "")
        )


def check_training_memory(build: Callable[[], torch.nn.Module]) -> None:
    """Refuse a model whose training state would not fit in memory, before allocating any of it: ``build()``
    runs on the meta device, which only counts its parameters and buffers."""
    check_memory(
        on_meta(build),
        TRAINING_BYTES_PER_PARAMETER,
        "fca train's model config",
        "for fp32 weights, gradients and AdamW",
    )
