"""The per-token NLL files an audit leaves behind (``per_token_nll.csv.gz``, and ``.parquet`` with pyarrow),
each bound to the model and the windows it came from (``results.binding``): the binding is the Parquet file's
schema metadata (``fca_binding``), and the comment field of the CSV's gzip header, which gzip readers skip, so
the CSV's text is unchanged for every reader (pandas, ``zcat``, a spreadsheet)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fca_workbench.foundation.files import reading
from fca_workbench.results.binding import BINDING_KEY, binding_text, parse_binding
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


def per_token_csv(frame: pd.DataFrame, bound: str) -> bytes:
    """The wide table as gzip CSV at 6 decimals, mtime 0, the binding text ``bound`` as the gzip header's
    comment: the same NLLs always give the same bytes. Level 1: on the full eval set level 9 took as long as
    formatting the text, for a file 9% smaller."""
    text = frame.to_csv(index=False, float_format="%.6f", lineterminator="\n")
    return gzip_with_comment(text.encode(), f"{BINDING_KEY}={bound}")


def per_token_parquet(frame: pd.DataFrame, bound: str) -> bytes:
    """The wide table as Parquet, the float32 NLLs exact, the binding text ``bound`` in its schema metadata
    (needs pyarrow: the ``parquet`` extra)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)  # what frame.to_parquet(index=False) writes
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), BINDING_KEY.encode(): bound.encode()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def per_token_files(per_token: dict[str, torch.Tensor], windows: torch.Tensor, bound: dict) -> dict[str, bytes]:
    """``per_token_nll.csv.gz`` and, when pyarrow is installed, ``per_token_nll.parquet``, both bound to
    ``bound`` (``binding``: the model, the eval and the calibration windows)."""
    frame = per_token_frame(per_token, windows)
    text = binding_text(bound)
    files = {PER_TOKEN_CSV: per_token_csv(frame, text)}
    if _has_pyarrow():
        files[PER_TOKEN_PARQUET] = per_token_parquet(frame, text)
    return files


def per_token_binding(path: Path) -> dict | None:
    """The binding a per-token file records (Parquet: its schema metadata; CSV: its gzip comment); None: it
    records none (written before artifacts were bound)."""
    with reading(f"{path} cannot be read"):
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            text = (pq.read_schema(path).metadata or {}).get(BINDING_KEY.encode())
        else:
            with open(path, "rb") as handle:
                comment = gzip_comment(handle.read(GZIP_HEADER_MAX_BYTES))
            key, _, value = (comment or "").partition("=")
            text = value if key == BINDING_KEY else None
    return parse_binding(text, str(path))


GZIP_FLAGS = {"extra": 0x04, "name": 0x08, "comment": 0x10}  # the header fields a gzip member may carry (RFC 1952)
GZIP_FAST = 4  # the header's XFL byte for level 1, as Python's gzip writes it
GZIP_HEADER_MAX_BYTES = 64 << 10  # read of a CSV to find its comment: a binding is ~200 bytes


def gzip_with_comment(payload: bytes, comment: str) -> bytes:
    """``payload`` as one gzip member at level 1, mtime 0, ``comment`` (Latin-1, no NUL) in its header's
    comment field: what ``gzip.GzipFile`` writes, plus the comment every gzip reader skips."""
    deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(payload) + deflate.flush()
    header = b"\x1f\x8b\x08" + bytes([GZIP_FLAGS["comment"]]) + b"\0\0\0\0" + bytes([GZIP_FAST, 255])
    trailer = struct.pack("<II", zlib.crc32(payload), len(payload) & 0xFFFFFFFF)
    return header + comment.encode("latin-1") + b"\0" + body + trailer


def gzip_comment(head: bytes) -> str | None:
    """The comment in the header of a gzip file whose first bytes are ``head``; None when it has none. A file
    that is not gzip is a ``ValueError``."""
    if head[:3] != b"\x1f\x8b\x08" or len(head) < 10:
        raise ValueError("not a gzip file")
    flags, at = head[3], 10
    if flags & GZIP_FLAGS["extra"]:
        at += 2 + int.from_bytes(head[at : at + 2], "little")
    for field in ("name", "comment"):
        if flags & GZIP_FLAGS[field]:
            end = head.find(b"\0", at)
            if end < 0:
                raise ValueError(f"its gzip header's {field} is longer than {len(head)} bytes")
            if field == "comment":
                return head[at:end].decode("latin-1")
            at = end + 1
    return None


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401  (only whether it is installed)
    except ImportError:
        return False
    return True
