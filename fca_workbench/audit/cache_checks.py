"""What a coefficient cache must hold to be read: a manifest made for this model, these windows and this capture
(``check_manifest``), and, in every tensor read back, only what capture writes (``stored_problem``), so a
forged but consistently re-sealed cache is one line, never an index out of range or an allocation by a forged
number."""

from pathlib import Path

import torch

from fca_workbench.adapters.kinds import INDEX_DTYPES, TOP_K_INDEX
from fca_workbench.foundation.errors import UserError


def check_manifest(manifest: dict, expected: dict, folder: Path) -> None:
    """Refuse a cache made for another model or other windows, naming which fingerprint differs."""
    for key, what in (("model_fingerprint", "model"), ("data_fingerprint", "data")):
        if manifest.get(key) != expected[key]:
            raise UserError(
                f"coefficient cache {folder} was captured from another {what} "
                f"({key} {str(manifest.get(key))[:12]} != {expected[key][:12]}); delete that folder to capture again"
            )
    for key in ("window", "shard_size", "dtype", "slot_shapes"):
        if manifest.get(key) != expected[key]:
            raise UserError(f"coefficient cache {folder} has {key}={manifest.get(key)}, this run needs {expected[key]}")


def stored_problem(manifest: dict, key: str, rows: torch.Tensor) -> str | None:
    """What is wrong with ``rows`` of the stored tensor ``key`` for this capture (None: nothing): a shard
    re-sealed with its hash and binding still holds only what capture writes, the NLL and coefficients in
    float32 at their shapes (the model's, ``check_manifest``), every other value ``[B, T, ...]``, and a
    router's top-k index in an index type within its coefficient's experts: anything else would index
    out of range or allocate by a forged number where replay uses it."""
    window, shape, dtype = manifest["window"], tuple(rows.shape[1:]), rows.dtype
    layer, _, name = key.partition(".")
    if key == "nll":
        expected: tuple[int, ...] | None = (window - 1,)
    elif not name:
        expected = (window, *manifest["slot_shapes"][int(layer.removeprefix("layer_"))])
    else:
        expected = None
    if expected is not None and (dtype != torch.float32 or shape != expected):
        return f"as {str(dtype).removeprefix('torch.')} {list(shape)}, not float32 {list(expected)}"
    if name and shape[:1] != (window,):
        return f"with {list(shape[:1])} tokens a window, not {window}"
    if name == TOP_K_INDEX:
        experts = manifest["slot_shapes"][int(layer.removeprefix("layer_"))][-1]
        if dtype not in INDEX_DTYPES or len(shape) != 2:
            return f"as {str(dtype).removeprefix('torch.')} {list(shape)}, not expert indices"
        if rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < experts:
            return f"naming experts {int(rows.min())} to {int(rows.max())}, of {experts}"
    return None
