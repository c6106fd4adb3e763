"""The static profiles file beside an audit (``static_profiles.safetensors``): written by the audit, its sha256
recorded in ``audit.json`` (``static_profiles.sha256``), read back by the notebooks and the dashboard, which use
it only when it still has that hash (``verified_profiles``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from fca_workbench.errors import UserError, first_line
from fca_workbench.files import write_atomic


def load_profiles(path: str | Path) -> dict[str, list[torch.Tensor]]:
    """Static profiles saved by the audit (``static_profiles.safetensors``), as ``static_profiles`` returns them."""
    from safetensors.torch import load_file

    return profiles_from_tensors(load_file(str(path)))


def profiles_from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """``<profile>.layer_<i>`` tensors (``audit.save_profiles``) back into per-profile lists of layers."""
    profiles: dict[str, dict[int, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, layer = key.rsplit(".layer_", 1)
        profiles.setdefault(name, {})[int(layer)] = tensor
    return {name: [layers[i] for i in sorted(layers)] for name, layers in profiles.items()}


def save_profiles(path: Path, profiles: dict[str, list[torch.Tensor]]) -> str:
    """The calibration set's static profiles, ``<profile>.layer_<i>``, next to the audit that used them; returns
    the sha256 of the bytes written, for ``audit.json``. Each tensor is copied: two profiles may be one tensor (a
    controller that routes to no experts has the same ``layer_mean`` and ``layer_mean_topk``), and safetensors
    refuses names that share storage."""
    tensors = {
        f"{name}.layer_{i}": t.detach().clone().contiguous()
        for name, layers in profiles.items()
        for i, t in enumerate(layers)
    }
    payload = save(tensors)
    write_atomic(path, payload)
    return hashlib.sha256(payload).hexdigest()


def verified_profiles(data: bytes, sha256: str | None, source: str) -> dict[str, list[torch.Tensor]]:
    """The profiles in ``data`` (the bytes of ``source``), only if they are the ones their audit wrote: the
    sha256 its ``audit.json`` records, a file that parses, every value finite; else a UserError saying why."""
    if sha256 is None:
        raise UserError(f"{source} cannot be checked: its audit.json records no sha256 of it")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"{source} is not the file its audit wrote: its sha256 differs from the one in audit.json")
    try:
        profiles = profiles_from_tensors(load(data))
    except (SafetensorError, ValueError) as exc:
        raise UserError(f"{source} does not parse as static profiles ({first_line(exc)})") from None
    if not all(bool(torch.isfinite(t).all()) for layers in profiles.values() for t in layers):
        raise UserError(f"{source} holds values that are not finite")
    return profiles
