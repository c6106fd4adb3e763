"""The static profiles file beside an audit (``static_profiles.safetensors``): written by the audit, read back by
the notebooks and the dashboard."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from fca_workbench.files import atomic_path


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


def save_profiles(path: Path, profiles: dict[str, list[torch.Tensor]]) -> None:
    """The calibration set's static profiles, ``<profile>.layer_<i>``, next to the audit that used them. Each
    tensor is copied: two profiles may be one tensor (a controller that routes to no experts has the same
    ``layer_mean`` and ``layer_mean_topk``), and safetensors refuses names that share storage."""
    tensors = {f"{name}.layer_{i}": t.detach().clone().contiguous() for name, layers in profiles.items() for i, t in enumerate(layers)}
    with atomic_path(path) as tmp:
        save_file(tensors, tmp)
