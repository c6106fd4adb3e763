"""Writing a model in the official MUDDPythia release layout (``config.json`` with ``auto_map``, safetensors or
``.bin`` weights, optionally sharded with an index): what the loader must read, for tests and GPU checks."""

from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from fca_workbench.foundation.checkpoint import BIN_FILE, BIN_INDEX, CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX
from fca_workbench.foundation.files import write_json
from fca_workbench.models.loading import OFFICIAL_1P4B_CONFIG, OFFICIAL_AUTO_MAP


def official_config_dict(config: PretrainedConfig, dtype: torch.dtype) -> dict:
    """``config`` as the releases write it: the official fields only, ``auto_map`` included."""
    import transformers

    out: dict[str, object] = {}
    for key in OFFICIAL_1P4B_CONFIG:
        if key == "architectures":
            out[key] = ["MUDDPythia"]
        elif key == "auto_map":
            out[key] = dict(OFFICIAL_AUTO_MAP)
        elif key == "torch_dtype":
            out[key] = str(dtype).removeprefix("torch.")
        elif key == "transformers_version":
            out[key] = transformers.__version__
        else:
            out[key] = getattr(config, key)
    return out


def save_official(
    model: PreTrainedModel,
    folder: str | Path,
    weights: str = "safetensors",
    shards: int = 1,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write ``model`` in the official layout: ``config.json`` with ``auto_map``, then the weights as
    ``model.safetensors`` / ``pytorch_model.bin`` (``shards`` > 1: numbered shards plus the index file)."""
    if weights not in ("safetensors", "bin"):
        raise ValueError(f"weights must be 'safetensors' or 'bin', not {weights!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    write_json(folder / CONFIG_FILE, official_config_dict(model.config, dtype))
    whole, index_file = (SAFETENSORS_FILE, SAFETENSORS_INDEX) if weights == "safetensors" else (BIN_FILE, BIN_INDEX)
    stem, suffix = whole.split(".")
    groups = _split_evenly(list(state), shards, state)
    names = (
        [whole]
        if len(groups) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(groups):05d}.{suffix}" for i in range(len(groups))]
    )
    for name, keys in zip(names, groups):
        part = {k: state[k] for k in keys}
        if weights == "safetensors":
            from safetensors.torch import save_file

            save_file(part, folder / name, metadata={"format": "pt"})
        else:
            torch.save(part, folder / name)
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
            "weight_map": {k: name for name, keys in zip(names, groups) for k in keys},
        }
        write_json(folder / index_file, index)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _split_evenly(keys: list[str], shards: int, state: dict) -> list[list[str]]:
    """Consecutive groups of keys of about equal bytes (at most ``shards``, none empty)."""
    shards = max(1, min(shards, len(keys)))
    total = sum(state[k].numel() * state[k].element_size() for k in keys)
    groups: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for key in keys:
        current.append(key)
        filled += state[key].numel() * state[key].element_size()
        if len(groups) < shards - 1 and filled >= total * (len(groups) + 1) / shards:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups
