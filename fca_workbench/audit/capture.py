"""Capture: one unperturbed pass over the windows, every layer's complete coefficients cached on disk.

The cache is a folder of safetensors shards (one per batch) plus ``manifest.json``. It is tied to the
exact model and windows by fingerprints, so replay can never mix coefficients from another model or other
data. Shards are written atomically and the manifest is marked complete only at the end, so an
interrupted capture never looks finished and a rerun resumes from the shards already written.

Integrity: the manifest records each shard's sha256 and size, hashed from the very bytes written. Only
shards it claims are ever used: a rerun resumes from the claimed shards whose hash still matches and
recaptures the others; shards in the folder that no manifest claims (another model's, a crash between
shard and manifest) are deleted before a capture starts. A finished cache is verified when opened, before
any figure is computed (every shard present, at its size and hash); a shard that fails stops the run with
one line naming it (delete the folder to capture again): damage to a finished cache is worth knowing
about, not papering over with a silent recapture.

Binding: each shard carries in its own safetensors metadata what made it (``shard_binding``: the model and data
fingerprints, the settings that change its content, its index), so a manifest that claims another capture's
shards, hashes and all, is refused when the cache is opened and never resumed from. Capture stops with one line
(``guard.require_finite``) before it writes a shard holding a NaN or an inf.
"""

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from filelock import FileLock
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from fca_workbench.adapters.placement import tensor_fingerprints
from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel
from fca_workbench.audit.cache_checks import check_manifest, stored_problem
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.forward import forward_nll
from fca_workbench.audit.guard import require_finite
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import (
    canonical_json,
    file_sha256,
    parse_json,
    read_json,
    schema_problem,
    write_atomic,
    write_json,
)
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.foundation.progress import progress
from fca_workbench.results.conditions import LIVE_RUN

Indices = Sequence[int] | torch.Tensor  # window indices, as a list or a LongTensor
CACHE_FORMAT = "fca-coefficient-cache/4"


# /1: no shard hashes, /2: shards not bound to what made them (both never trusted); /3: routers' logits and
# top-k weights stored beside their gate, int64 indices; all recaptured
LEGACY_FORMATS = ("fca-coefficient-cache/1", "fca-coefficient-cache/2", "fca-coefficient-cache/3")


BOUND_KEYS = ("model_fingerprint", "data_fingerprint", "windows", "window", "shard_size", "dtype")


MANIFEST = "manifest.json"


SHARD_FILE = re.compile(r"^\.?shard_\d{5}\.safetensors(\.tmp)?$")  # shards and their temporary names


MANIFEST_SCHEMA = {
    "type": "object",
    "required": [
        "format",
        "model_fingerprint",
        "data_fingerprint",
        "windows",
        "window",
        "shard_size",
        "dtype",
        "slot_shapes",
        "shards",
        "complete",
    ],
    "properties": {
        "model_fingerprint": {"type": "string"},
        "data_fingerprint": {"type": "string"},
        "windows": {"type": "integer", "minimum": 0},
        "window": {"type": "integer", "minimum": 1},
        "shard_size": {"type": "integer", "minimum": 1},
        "dtype": {"type": "string"},
        "slot_shapes": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
        "shards": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["sha256", "bytes"],
                "properties": {
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "bytes": {"type": "integer", "minimum": 0},
                },
            },
        },
        "complete": {"type": "boolean"},
    },
}


def model_fingerprint(model: Any) -> str:
    """sha256 over the config and every weight, so any change to the model changes it; not over where it was
    loaded from (the config's ``_name_or_path``), so one checkpoint reached by two spellings of its path, or
    from two nodes that mount it differently, shares its caches; nor over where its weights are (a model placed
    by big-model inference, offloaded weights streamed in, fingerprints as the same model held in memory)."""
    fields = json.loads(model.config.to_json_string(use_diff=False))
    fields.pop("_name_or_path", None)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for name, tensor_fingerprint in sorted(tensor_fingerprints(model, fingerprint_tensor).items()):
        digest.update(name.encode())
        digest.update(tensor_fingerprint.encode())
    return digest.hexdigest()


def library_versions() -> dict:
    """The versions the cache was written with, recorded in its manifest."""
    import safetensors
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }


class CoefficientCache:
    """Read access to a finished capture: coefficients and unperturbed NLL of any set of windows.

    ``open_cache`` builds it and ``verify``s every shard first; a read that still fails (a shard changed
    since) is a one-line UserError naming the shard.
    """

    def __init__(self, folder: Path, manifest: dict):
        self.folder = Path(folder)
        self.manifest = manifest
        self.shard_size = manifest["shard_size"]
        self.num_windows = manifest["windows"]
        self.num_layers = len(manifest["slot_shapes"])

    def shard_path(self, shard: int) -> Path:
        return self.folder / f"shard_{shard:05d}.safetensors"

    def num_shards(self) -> int:
        return shard_count(self.num_windows, self.shard_size)

    def damaged(self, shard: int, why: str) -> UserError:
        return UserError(
            f"coefficient cache shard {self.shard_path(shard)} {why}; delete {self.folder} to capture again"
        )

    def verify(self) -> None:
        """Check a finished cache before any of it is used: every shard claimed by the manifest, present,
        at its size and with its sha256 (each shard read once more; hashing is fast next to a forward)."""
        for shard in range(self.num_shards()):
            path = self.shard_path(shard)
            claim = self.manifest["shards"].get(path.name)
            if claim is None:
                raise self.damaged(shard, f"is not listed in {MANIFEST}")
            if not path.is_file():
                raise self.damaged(shard, "is missing")
            if path.stat().st_size != claim["bytes"]:
                raise self.damaged(shard, f"has {path.stat().st_size} bytes, {MANIFEST} says {claim['bytes']}")
            try:
                digest = file_sha256(path)
            except OSError as exc:
                raise self.damaged(shard, f"is unreadable ({first_line(exc)})") from None
            if digest != claim["sha256"]:
                raise self.damaged(shard, f"is damaged: its sha256 differs from the one in {MANIFEST}")
            mismatch = binding_mismatch(path, shard_binding(self.manifest, shard))
            if mismatch is not None:
                raise self.damaged(shard, f"belongs to another capture ({mismatch})")

    def _read(self, key: str, indices: torch.Tensor) -> torch.Tensor:
        """Rows ``indices`` of one stored tensor, in the order asked for, opening each shard once."""
        shards = indices // self.shard_size
        out: torch.Tensor | None = None
        for shard in shards.unique().tolist():
            positions = (shards == shard).nonzero().squeeze(1)
            try:
                with safe_open(self.shard_path(shard), framework="pt") as handle:
                    rows = handle.get_tensor(key)[indices[positions] - shard * self.shard_size]
            except (OSError, SafetensorError, IndexError) as exc:
                raise self.damaged(shard, f"is unreadable ({first_line(exc)})") from None
            problem = stored_problem(self.manifest, key, rows)
            if problem is not None:
                raise self.damaged(shard, f"holds {key} {problem}")
            if out is None:
                out = rows.new_empty((len(indices), *rows.shape[1:]))
            out[positions] = rows
        assert out is not None, "no rows asked for"
        return out

    def coefficients(self, indices: Indices) -> list[torch.Tensor]:
        indices = torch.as_tensor(indices, dtype=torch.long)
        return [self._read(f"layer_{layer}", indices) for layer in range(self.num_layers)]

    def values(self, indices: Indices) -> list[dict[str, torch.Tensor]]:
        """Per controller, everything captured for ``indices``: ``"coefficient"`` plus the rest of the
        controller's output (e.g. a router's whole output), each ``[B, T, ...]``, as the model made it."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        try:
            with safe_open(self.shard_path(0), framework="pt") as handle:
                keys = list(handle.keys())
        except (OSError, SafetensorError) as exc:
            raise self.damaged(0, f"is unreadable ({first_line(exc)})") from None
        return [
            {
                COEFFICIENT: coefficient,
                **{key.split(".", 1)[1]: self._read(key, indices) for key in keys if key.startswith(f"layer_{layer}.")},
            }
            for layer, coefficient in enumerate(self.coefficients(indices))
        ]

    def nll(self, indices: Indices) -> torch.Tensor:
        return self._read("nll", torch.as_tensor(indices, dtype=torch.long))

    def shard_indices(self, shards: Iterable[int] | None = None) -> Iterator[torch.Tensor]:
        """The window indices of each shard in turn (of ``shards`` only, e.g. one rank's share): the batching
        capture used."""
        for shard in range(self.num_shards()) if shards is None else shards:
            start = shard * self.shard_size
            yield torch.arange(start, min(start + self.shard_size, self.num_windows))

    def batches(self, shards: Iterable[int] | None = None) -> Iterator[list[torch.Tensor]]:
        """Per-layer coefficients shard by shard: memory bounded by one shard."""
        for indices in self.shard_indices(shards):
            yield self.coefficients(indices)


def shard_count(windows: int, shard_size: int) -> int:
    """Shards of ``shard_size`` windows (the last one may be short) that ``windows`` windows fill."""
    return -(-windows // shard_size)


def read_manifest(folder: Path) -> dict | None:
    """The cache's manifest; None when there is none, or one of an older format (recaptured)."""
    path = Path(folder) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    try:
        manifest = read_json(path, expect=None)
    except UserError as exc:
        raise UserError(f"coefficient cache {folder}: {exc}; delete {folder} to capture again") from None
    if isinstance(manifest, dict) and manifest.get("format") in LEGACY_FORMATS:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        raise UserError(
            f"coefficient cache {folder}: {MANIFEST} is not a {CACHE_FORMAT} manifest; delete {folder} to capture again"
        )
    problem = schema_problem(manifest, MANIFEST_SCHEMA)  # jsonschema: slow to import, only when a cache is opened
    if problem:
        raise UserError(
            f"coefficient cache {folder}: {MANIFEST} is malformed ({problem}); delete {folder} to capture again"
        )
    return manifest


def open_cache(folder: str | Path) -> CoefficientCache:
    """A finished capture, checked: manifest well-formed and complete, every shard at its size and hash."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise UserError(f"no coefficient cache in {folder}")
    if not manifest["complete"]:
        raise UserError(f"coefficient cache {folder} is incomplete; rerun the audit to finish it")
    cache = CoefficientCache(folder, manifest)
    cache.verify()
    return cache


def remove_unclaimed_shards(folder: Path, claimed: Collection[str]) -> None:
    """Delete shard files no manifest claims: another capture's, or written just before a crash."""
    if folder.is_dir():
        for path in folder.iterdir():
            if SHARD_FILE.match(path.name) and path.name not in claimed:
                path.unlink()


BINDING = "fca_binding"  # the shard's metadata key: its binding as one canonical JSON text, so its bytes are stable


def shard_binding(manifest: dict, shard: int) -> dict:
    """What made shard ``shard`` of the capture ``manifest`` describes: stored in the shard, checked on reuse."""
    return {"format": CACHE_FORMAT, **{key: manifest[key] for key in BOUND_KEYS}, "shard": shard}


def binding_mismatch(path: Path, expected: dict) -> str | None:
    """None when the shard at ``path`` carries the binding ``expected``; else which entry differs."""
    try:
        with safe_open(path, framework="pt") as handle:
            text = (handle.metadata() or {}).get(BINDING)
        found = parse_json(text, f"{path.name}'s binding") if text is not None else {}
    except (OSError, SafetensorError, UserError) as exc:
        return f"unreadable binding: {first_line(exc)}"
    if not isinstance(found, dict):
        return "unreadable binding"
    for key, value in expected.items():
        if found.get(key) != value:
            return f"its {key} is {str(found.get(key))[:16]}, this capture's {str(value)[:16]}"
    return None


def write_shard(tensors: dict[str, torch.Tensor], path: Path, binding: dict) -> dict:
    """Write one shard atomically, ``binding`` in its metadata; returns the sha256 and size of exactly the bytes
    written."""
    payload = save(tensors, metadata={BINDING: canonical_json(binding)})
    write_atomic(path, payload)
    return {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}


def record_claim(manifest_path: Path, name: str, claim: dict) -> None:
    """Add one written shard to the manifest on disk. Under torchrun several ranks write shards of one
    cache at once, so each claim is read-modify-written under a lock beside the manifest."""
    with FileLock(manifest_path.with_name(f".{MANIFEST}.lock")):
        manifest = cast(dict, read_json(manifest_path))
        manifest["shards"] = dict(sorted({**manifest["shards"], name: claim}.items()))  # the same file for any ranks
        write_json(manifest_path, manifest)


@torch.no_grad()
def capture(
    model: ControlledModel,
    windows: torch.Tensor,
    folder: str | Path,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    desc: str = "capture",
    ranks: Ranks = SINGLE,
    fingerprint: str | None = None,
) -> CoefficientCache:
    """Capture (or resume, or reuse) the coefficient cache of ``model`` on ``windows`` in ``folder``.

    ``ranks`` (``distributed.Ranks``): under torchrun each rank captures its share of the shards, numbered as
    one process numbers them; rank 0 alone prepares and completes the manifest. ``fingerprint``: the model's
    ``model_fingerprint``, when the caller has just taken it (hashing every weight costs seconds at real
    sizes; an audit takes it once for both its captures)."""
    folder = Path(folder)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    manifest: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "model_fingerprint": fingerprint or model_fingerprint(model),
        "data_fingerprint": fingerprint_tensor(windows),
        "windows": len(windows),
        "window": windows.shape[1],
        "shard_size": batch_size,
        "dtype": dtype,
        "slot_shapes": [list(shape) for shape in model.coefficient_slot_shapes],
        "controllers": list(model.controller_names),
        "versions": library_versions(),
        "shards": {},
        "complete": False,
    }
    existing = read_manifest(folder)
    if existing is not None:
        check_manifest(existing, manifest, folder)
        if existing["complete"]:
            return open_cache(folder)
        manifest["shards"] = existing["shards"]  # the interrupted capture's; each is verified before reuse
    manifest_path = folder / MANIFEST
    if ranks.lead:
        remove_unclaimed_shards(folder, manifest["shards"])
        write_json(manifest_path, manifest)
    ranks.barrier()
    model.eval()
    cache = CoefficientCache(folder, manifest)
    for shard in progress(ranks.share(cache.num_shards()), desc=desc, unit="shard", leave=False):
        path = cache.shard_path(shard)
        claim = manifest["shards"].get(path.name)
        binding = shard_binding(manifest, shard)
        if (
            claim is not None
            and path.is_file()
            and file_sha256(path) == claim["sha256"]
            and binding_mismatch(path, binding) is None
        ):
            continue
        rows = range(shard * batch_size, min((shard + 1) * batch_size, len(windows)))
        batch = windows[rows.start : rows.stop].to(device)
        nll, values = forward_nll(model, batch)
        for name, value in zip(model.controller_names, values):  # the coefficients; the rest may hold masks (-inf)
            require_finite(value[COEFFICIENT], f"coefficient of controller {name}", LIVE_RUN, rows, folder.name)
        tensors = {
            f"layer_{layer}": value[COEFFICIENT].float().cpu().contiguous() for layer, value in enumerate(values)
        }
        # what replay needs of the rest of each controller's output (its kind's ``to_values``), in the dtype it
        # came in, so replaying it is exact
        tensors.update(
            {
                f"layer_{layer}.{name}": t.cpu().contiguous()
                for layer, value in enumerate(values)
                for name, t in value.items()
                if name != COEFFICIENT
            }
        )
        tensors["nll"] = nll.cpu().contiguous()
        require_finite(tensors["nll"], "NLL", LIVE_RUN, rows, folder.name)
        record_claim(manifest_path, path.name, write_shard(tensors, path, binding))
    ranks.barrier()
    if ranks.lead:
        manifest = cast(dict, read_json(manifest_path))  # with every rank's claims
        manifest["complete"] = True
        write_json(manifest_path, manifest)
    ranks.barrier()
    # not ``open_cache``: every shard's hash was just taken from the bytes written (or checked before reuse),
    # and re-reading them and validating this manifest (importing jsonschema: seconds) cost up to 17% of a capture;
    # the manifest is read back from disk, where every rank's claims are
    return CoefficientCache(folder, cast(dict, read_json(manifest_path)))
