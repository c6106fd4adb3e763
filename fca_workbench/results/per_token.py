"""The per-token NLL files an audit leaves behind (``per_token_nll.csv.gz``, and ``.parquet`` with pyarrow)."""

from __future__ import annotations

import gzip
import io
from typing import TYPE_CHECKING

import numpy as np

from fca_workbench.results.layout import PER_TOKEN_CSV, PER_TOKEN_PARQUET

if TYPE_CHECKING:  # pandas and torch are imported when a table is built, never by ``import fca_workbench``
    import pandas as pd
    import torch

PER_TOKEN_KEYS = ["window", "position", "target_token"]


def per_token_frame(per_token: dict[str, torch.Tensor], windows: torch.Tensor) -> pd.DataFrame:
    """Wide table: one row per predicted token (window, position, target token), one float32 NLL column per
    condition, built from the ``[N, T-1]`` tensors in one step."""
    import pandas as pd
    import torch

    names = list(per_token)
    values = torch.stack([per_token[name].float() for name in names], dim=-1).numpy()  # [N, T-1, C]
    n, t, c = values.shape
    frame = pd.DataFrame(
        {
            "window": np.repeat(np.arange(n, dtype=np.int64), t),
            "position": np.tile(np.arange(1, t + 1, dtype=np.int64), n),
            "target_token": windows[:, 1:].reshape(-1).numpy().astype(np.int64),
        }
    )
    return pd.concat([frame, pd.DataFrame(values.reshape(n * t, c), columns=names)], axis=1)


def per_token_csv(frame: pd.DataFrame) -> bytes:
    """The wide table as gzip CSV at 6 decimals, mtime 0: the same NLLs always give the same bytes. Level 1:
    on the full eval set level 9 took as long as formatting the text, for a file 9% smaller."""
    text = frame.to_csv(index=False, float_format="%.6f", lineterminator="\n")
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=1) as gz:
        gz.write(text.encode())
    return buffer.getvalue()


def per_token_parquet(frame: pd.DataFrame) -> bytes:
    """The wide table as Parquet, the float32 NLLs exact (needs pyarrow: the ``parquet`` extra)."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def per_token_files(per_token: dict[str, torch.Tensor], windows: torch.Tensor) -> dict[str, bytes]:
    """``per_token_nll.csv.gz`` and, when pyarrow is installed, ``per_token_nll.parquet``."""
    frame = per_token_frame(per_token, windows)
    files = {PER_TOKEN_CSV: per_token_csv(frame)}
    if _has_pyarrow():
        files[PER_TOKEN_PARQUET] = per_token_parquet(frame)
    return files


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401  (only whether it is installed)
    except ImportError:
        return False
    return True
