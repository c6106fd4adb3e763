"""A tensor's fingerprint: identifies windows or weights exactly. Apart from ``files`` because it needs torch,
and the command line reads and writes JSON through ``files`` before torch is imported."""

import hashlib

import torch

COPIED_BYTES = 64 << 20  # of a tensor off an accelerator at a time: hashing in threads holds little host memory


def fingerprint_tensor(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's shape, dtype and bytes; a tensor in host memory is hashed in place, one elsewhere
    copied over in pieces (the digest is the same: sha256 reads its bytes in order either way)."""
    digest = hashlib.sha256(f"{tuple(tensor.shape)}|{tensor.dtype}".encode())
    flat = tensor.detach().reshape(-1).view(torch.uint8)  # no copy when contiguous
    if flat.device.type == "cpu":
        digest.update(flat.numpy().data)
    else:
        for start in range(0, flat.numel(), COPIED_BYTES):
            digest.update(flat[start : start + COPIED_BYTES].cpu().numpy().data)
    return digest.hexdigest()
