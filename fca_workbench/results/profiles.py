"""The static profiles file beside an audit (``static_profiles.safetensors``): written by the audit with its
binding (the model and calibration windows it came from, ``results.binding``) in its own metadata, its sha256
recorded in ``audit.json`` (``static_profiles.sha256``), read back by the notebooks, the dashboard and the
export, which use it only when it still has that hash and is bound to the model and windows they expect
(``verified_profiles``)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import parse_json, reading, write_atomic
from fca_workbench.results.binding import (
    BINDING_KEY,
    RERUN_AUDIT,
    audit_binding,
    binding_text,
    check_binding,
    parse_binding,
)
from fca_workbench.results.layout import AUDIT_FILE
from fca_workbench.results.schema import read_audit_json


def load_profiles(path: str | Path) -> dict[str, list[torch.Tensor]]:
    """Static profiles saved by the audit (an audit folder's ``static_profiles.safetensors``), as
    ``static_profiles`` returns them, checked against the ``audit.json`` beside them (``verified_profiles``)."""
    path = Path(path)
    audit, _ = read_audit_json(path.parent)
    with reading(f"cannot read {path}"):
        data = path.read_bytes()
    recorded = (audit.get("static_profiles") or {}).get("sha256")
    expected = audit_binding(audit, ("calibration",))
    return verified_profiles(data, recorded, str(path), expected, f"the {AUDIT_FILE} beside it")


def profiles_from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """``<profile>.layer_<i>`` tensors (``audit.save_profiles``) back into per-profile lists of layers."""
    profiles: dict[str, dict[int, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, layer = key.rsplit(".layer_", 1)
        profiles.setdefault(name, {})[int(layer)] = tensor
    return {name: [layers[i] for i in sorted(layers)] for name, layers in profiles.items()}


def save_profiles(path: Path, profiles: dict[str, list[torch.Tensor]], bound: dict) -> str:
    """The calibration set's static profiles, ``<profile>.layer_<i>``, next to the audit that used them, with
    ``bound`` (``binding``: the model and the calibration windows) in the file's metadata; returns the sha256
    of the bytes written, for ``audit.json``. Each tensor is copied: two profiles may be one tensor (a
    controller that routes to no experts has the same ``layer_mean`` and ``layer_mean_topk``), and safetensors
    refuses names that share storage."""
    tensors = {
        f"{name}.layer_{i}": t.detach().clone().contiguous()
        for name, layers in profiles.items()
        for i, t in enumerate(layers)
    }
    payload = save(tensors, metadata={BINDING_KEY: binding_text(bound)})
    write_atomic(path, payload)
    return hashlib.sha256(payload).hexdigest()


def verified_profiles(
    data: bytes, sha256: str | None, source: str, expected: dict, against: str
) -> dict[str, list[torch.Tensor]]:
    """The profiles in ``data`` (the bytes of ``source``), only if they are the ones their audit wrote: the
    sha256 its ``audit.json`` records, a file that parses, bound in its own metadata to the model and the
    calibration windows of ``expected`` (a ``binding``, from ``against``), every value finite; else a
    UserError saying why."""
    if sha256 is None:
        raise UserError(f"{source} cannot be checked: its audit.json records no sha256 of it")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"{source} is not the file its audit wrote: its sha256 differs from the one in audit.json")
    try:
        profiles = profiles_from_tensors(load(data))
    except (SafetensorError, ValueError) as exc:
        raise UserError(f"{source} does not parse as static profiles ({first_line(exc)})") from None
    check_binding(_recorded_binding(data, source), expected, source, against, RERUN_AUDIT)
    if not all(bool(torch.isfinite(t).all()) for layers in profiles.values() for t in layers):
        raise UserError(f"{source} holds values that are not finite")
    return profiles


def _recorded_binding(data: bytes, source: str) -> dict | None:
    """The binding the metadata of a profiles file records (``data``, the bytes of ``source``, which safetensors
    has parsed: its header is whole); None: it records none."""
    (length,) = struct.unpack("<Q", data[:8])
    header = parse_json(data[8 : 8 + length], f"the header of {source}")
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return parse_binding(metadata.get(BINDING_KEY) if isinstance(metadata, dict) else None, source)
