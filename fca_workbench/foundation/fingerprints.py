"""A tensor's fingerprint: identifies windows or weights exactly. Apart from ``files`` because it needs torch,
and the command line reads and writes JSON through ``files`` before torch is imported."""

import hashlib

import torch


def fingerprint_tensor(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's shape, dtype and bytes."""
    digest = hashlib.sha256(f"{tuple(tensor.shape)}|{tensor.dtype}".encode())
    digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)  # no copy
    return digest.hexdigest()
