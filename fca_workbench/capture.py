"""Capture: one unperturbed pass over the windows, every layer's complete coefficients cached on disk.

The cache is a folder of safetensors shards (one per batch) plus ``manifest.json``. It is tied to the
exact model and windows by fingerprints, so replay can never mix coefficients from another model or other
data. Shards are written atomically and the manifest is marked complete only at the end, so an
interrupted capture never looks finished and a rerun resumes from the shards already written.
"""

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .data import fingerprint_tensor, write_atomic
from .errors import UserError
from .adapters.protocol import COEFFICIENT
from .models import next_token_nll

CACHE_FORMAT = "fca-coefficient-cache/1"


def model_fingerprint(model) -> str:
    """sha256 over the config and every weight, so any change to the model changes it."""
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(fingerprint_tensor(tensor).encode())
    return digest.hexdigest()


def library_versions() -> dict:
    import safetensors
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "safetensors": safetensors.__version__}


class CoefficientCache:
    """Read access to a finished capture: coefficients and unperturbed NLL of any set of windows."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = Path(folder)
        self.manifest = manifest
        self.shard_size = manifest["shard_size"]
        self.num_windows = manifest["windows"]
        self.num_layers = len(manifest["slot_shapes"])

    def shard_path(self, shard: int) -> Path:
        return self.folder / f"shard_{shard:05d}.safetensors"

    def _read(self, key: str, indices: torch.Tensor) -> torch.Tensor:
        """Rows ``indices`` of one stored tensor, in the order asked for, opening each shard once."""
        shards = indices // self.shard_size
        out = None
        for shard in shards.unique().tolist():
            positions = (shards == shard).nonzero().squeeze(1)
            with safe_open(self.shard_path(shard), framework="pt") as handle:
                rows = handle.get_tensor(key)[indices[positions] - shard * self.shard_size]
            if out is None:
                out = rows.new_empty((len(indices), *rows.shape[1:]))
            out[positions] = rows
        return out

    def coefficients(self, indices) -> list[torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.long)
        return [self._read(f"layer_{layer}", indices) for layer in range(self.num_layers)]

    def values(self, indices) -> list[dict[str, torch.Tensor]]:
        """Per controller, everything captured for ``indices``: ``"coefficient"`` plus the rest of the
        controller's output (e.g. a router's whole output), each ``[B, T, ...]``, as the model made it."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        with safe_open(self.shard_path(0), framework="pt") as handle:
            keys = list(handle.keys())
        return [
            {COEFFICIENT: coefficient,
             **{key.split(".", 1)[1]: self._read(key, indices) for key in keys if key.startswith(f"layer_{layer}.")}}
            for layer, coefficient in enumerate(self.coefficients(indices))
        ]

    def nll(self, indices) -> torch.Tensor:
        return self._read("nll", torch.as_tensor(indices, dtype=torch.long))

    def shard_indices(self):
        """The window indices of each shard in turn: the batching capture used."""
        for start in range(0, self.num_windows, self.shard_size):
            yield torch.arange(start, min(start + self.shard_size, self.num_windows))

    def batches(self):
        """Per-layer coefficients shard by shard: memory bounded by one shard."""
        for indices in self.shard_indices():
            yield self.coefficients(indices)


def check_manifest(manifest: dict, expected: dict, folder: Path) -> None:
    """Refuse a cache made for another model or other windows, naming which fingerprint differs."""
    for key, what in (("model_fingerprint", "model"), ("data_fingerprint", "data")):
        if manifest.get(key) != expected[key]:
            raise UserError(
                f"coefficient cache {folder} was captured from another {what} "
                f"({key} {str(manifest.get(key))[:12]} != {expected[key][:12]}); use another --cache or delete it"
            )
    for key in ("window", "shard_size", "dtype"):
        if manifest.get(key) != expected[key]:
            raise UserError(
                f"coefficient cache {folder} has {key}={manifest.get(key)}, this run needs {expected[key]}"
            )


@torch.no_grad()
def capture(model, windows: torch.Tensor, folder, batch_size: int = 16, device="cpu", desc="capture") -> CoefficientCache:
    """Capture (or resume, or reuse) the coefficient cache of ``model`` on ``windows`` in ``folder``."""
    folder = Path(folder)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    manifest = {
        "format": CACHE_FORMAT,
        "model_fingerprint": model_fingerprint(model),
        "data_fingerprint": fingerprint_tensor(windows),
        "windows": len(windows),
        "window": windows.shape[1],
        "shard_size": batch_size,
        "dtype": dtype,
        "slot_shapes": [list(shape) for shape in model.coefficient_slot_shapes],
        "controllers": list(model.controller_names),
        "versions": library_versions(),
        "complete": False,
    }
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        existing = json.loads(manifest_path.read_text())
        check_manifest(existing, manifest, folder)
        if existing["complete"]:
            return CoefficientCache(folder, existing)
    else:
        write_atomic(manifest_path, json.dumps(manifest, indent=2).encode())
    model.eval()
    cache = CoefficientCache(folder, manifest)
    shards = range(-(-len(windows) // batch_size))
    for shard in tqdm(shards, desc=desc, unit="shard", leave=False):
        path = cache.shard_path(shard)
        if path.is_file():
            continue
        batch = windows[shard * batch_size : (shard + 1) * batch_size].to(device)
        logits, values = model.capture_run(batch)
        tensors = {f"layer_{layer}": value[COEFFICIENT].float().cpu().contiguous() for layer, value in enumerate(values)}
        # the rest of each controller's output, in the dtype it came in, so replaying it is exact
        tensors.update({f"layer_{layer}.{name}": t.cpu().contiguous() for layer, value in enumerate(values)
                        for name, t in value.items() if name != COEFFICIENT})
        tensors["nll"] = next_token_nll(logits, batch).cpu().contiguous()
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, tmp)
        tmp.replace(path)
    manifest["complete"] = True
    write_atomic(manifest_path, json.dumps(manifest, indent=2).encode())
    return cache
