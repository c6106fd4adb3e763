"""Device memory budgeting: how many windows (or condition variants) one forward may hold at once.

A no-grad forward's memory is estimated from the model's sizes; on CUDA the batch is fitted to the free memory
less a reserve, on CPU it is fixed (a CPU gains no speed from a bigger batch).
"""

from pathlib import Path
from typing import Any, cast

import torch

from fca_workbench.audit.capture import MANIFEST
from fca_workbench.audit.settings import CPU_BATCH_SIZE
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json

MAX_BATCH_SIZE = 64


SAFETY = 1.5  # the estimate below counts the large tensors only; allocator slack and small ones are extra


RESERVE_BYTES = 2 * 2**30  # left free for the CUDA context growth, cuBLAS workspaces and fragmentation
PREFIX_STORE_BYTES = 256 * 2**20  # kept layer states of the prefix windows one user (a dashboard session) may hold
PREFIX_STORE_WINDOWS = 4


# config attribute names of each size, in the workbench's families and in transformers' configs
SIZE_FIELDS = {
    "width": ("hidden_size", "n_embd", "dim", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "vocab_size": ("vocab_size",),
}
STATE_FIELDS = ("state_size", "ssm_state_size", "d_state")  # a selective scan's state per channel


def config_size(config: Any, fields: tuple[str, ...]) -> int | None:
    """The first of ``fields`` the config holds as an int, else None."""
    return next((getattr(config, f) for f in fields if isinstance(getattr(config, f, None), int)), None)


def model_sizes(model: Any) -> dict[str, int]:
    """Width, layers, heads, vocabulary and FFN width of any controlled model, read from its config by the
    names the workbench's families and transformers use (layers: the protocol's ``blocks`` if the config
    names none; FFN: ``intermediate_size``, at least 4 × width). A config that names a scan state and no
    heads is attention-free (heads 0); ``state`` is its state size, 0 for every other model."""
    config = model.config
    state = config_size(config, STATE_FIELDS)
    sizes = {"state": 0}
    for size, fields in SIZE_FIELDS.items():
        found = config_size(config, fields)
        if found is None and size == "layers":
            found = len(model.blocks)
        if found is None and size == "heads" and state is not None:
            found, sizes["state"] = 0, state
        if found is None:
            raise UserError(
                f"cannot size the audit's batches: the {type(config).__name__} names no {size} "
                f"({' / '.join(fields)}); pass --batch-size"
            )
        sizes[size] = found
    sizes["ffn"] = max(4 * sizes["width"], getattr(config, "intermediate_size", None) or 0)
    return sizes


def window_bytes(model: Any, window: int) -> int:
    """An upper estimate of the GPU memory one window of ``window`` tokens needs in a no-grad forward plus
    the NLL of its logits, from the model's sizes (``model_sizes``; the large tensors only):

    * every layer output kept for the cross-layer mix: ``(layers + 1) · T · width``, plus about 8 stream
      and mixing temporaries ``T · width``;
    * attention scores, scaled, masked and softmaxed: 4 × ``heads · T²``;
    * the widest FFN hidden (1.5 × the FFN width: MUDDPythia's schedule), input and activation:
      2 × ``T · 1.5 · ffn``;
    * logits in the model dtype, then their fp32 copy, log-softmax and loss temporaries: ``T · vocab · (e + 12)``;
    * for an attention-free selective scan (a state size and no heads: Mamba), its discretized transition and
      input, fp32 whatever the model's dtype, at every token, channel and state entry: 2 × 4 ``T · inner · state``
      bytes (inner: ``intermediate_size``, else 2 × width).
    """
    sizes = model_sizes(model)
    element = next(model.parameters()).element_size()
    width, layers, heads, vocab = sizes["width"], sizes["layers"], sizes["heads"], sizes["vocab_size"]
    activations = ((layers + 1) + 8) * window * width * element + 2 * window * (3 * sizes["ffn"] // 2) * element
    attention = 4 * heads * window * window * element
    logits = window * vocab * (element + 12)
    inner = getattr(model.config, "intermediate_size", None) or 2 * width
    scan = 2 * 4 * window * inner * sizes["state"]
    return int(activations + attention + logits + scan)


def audit_batch_size(model: Any, window: int, device: str | torch.device, cache: Path | None = None) -> int:
    """Windows per batch when the user gave none: a finished or partial capture's shard size when
    ``cache`` holds one (so a rerun can reuse it), 16 on CPU, and on CUDA as many windows as fit in the
    free GPU memory (``torch.cuda.mem_get_info``, less the weights if they are not on the GPU yet and a
    reserve) at ``SAFETY`` × ``window_bytes``, between 1 and 64."""
    manifest = Path(cache) / MANIFEST if cache is not None else None
    if manifest is not None and manifest.is_file():
        try:
            shard_size = cast(dict, read_json(manifest)).get("shard_size")
        except UserError:
            shard_size = None  # an unreadable manifest is reported by capture itself
        if type(shard_size) is int and shard_size >= 1:
            return shard_size
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BATCH_SIZE
    free, _ = torch.cuda.mem_get_info(device)
    weights_elsewhere = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "cuda")
    usable = free - weights_elsewhere - RESERVE_BYTES
    fits = int(usable // (SAFETY * window_bytes(model, window)))
    return max(1, min(MAX_BATCH_SIZE, fits))


def conditions_per_pass(model: Any, batch: torch.Tensor, conditions: int, device: str | torch.device) -> int:
    """Conditions resumed together at one layer: on CUDA as many as the free memory holds next to the kept
    states (``official.window_bytes`` per window, as the audit's batch size is fitted); elsewhere one, since
    a CPU gains no speed from a bigger batch and only holds more memory; one too for a model whose config
    names no size to estimate from (RWKV names no heads: its audit was given ``--batch-size``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    try:
        per_window = window_bytes(model, batch.shape[1])
    except UserError:
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    rows = int((free - RESERVE_BYTES) // (SAFETY * per_window))
    return max(1, min(conditions, rows // len(batch)))
