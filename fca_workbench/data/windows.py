"""Text files in, fixed-length windows out.

Windows are the unit of batching, reassignment and bootstrap throughout the workbench, so everything
downstream sees a ``LongTensor [N, window]``.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:  # the tokenizer's type only: importing transformers here would slow every import of data
    from transformers import PreTrainedTokenizerBase

from fca_workbench.errors import UserError
from fca_workbench.files import parse_json


def read_documents(path: str | Path) -> list[str]:
    """Documents from a UTF-8 text file (one document) or JSONL of ``{"text": ...}``, optionally gzipped."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"text file not found: {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UserError(f"{path} is not a readable gzip file: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    stem = path.name.removesuffix(".gz")
    documents = parse_jsonl(text, path) if stem.endswith(".jsonl") else [text]
    documents = [doc for doc in documents if doc.strip()]
    if not documents:
        raise UserError(f"{path} contains no text")
    return documents


def parse_jsonl(text: str, path: Path) -> list[str]:
    """The ``text`` field of each non-blank line; a line that is not such a record is a one-line ``UserError``."""
    documents = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        record = parse_json(line.removeprefix("\ufeff") if number == 1 else line, f"{path} line {number}")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserError(f'{path} line {number} has no string field "text"')
        documents.append(record["text"])
    return documents


def token_stream(tokenizer: PreTrainedTokenizerBase, documents: list[str]) -> torch.Tensor:
    """All documents' tokens end to end, each followed by EOS so windows can cross document borders."""
    ids = []
    for doc in documents:
        ids.extend(tokenizer(doc)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def make_windows(stream: torch.Tensor, window: int) -> torch.Tensor:
    """Non-overlapping windows ``[N, window]``; the tail shorter than a window is dropped."""
    if window < 2:
        raise UserError(f"window must be at least 2 tokens, got {window}")
    count = len(stream) // window
    if count == 0:
        raise UserError(f"text has {len(stream)} tokens, fewer than one window of {window}")
    return stream[: count * window].view(count, window)


def load_windows(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, window: int, max_windows: int | None = None
) -> torch.Tensor:
    """The text's windows; ``max_windows`` of them spread evenly over it (``even_sample``) when given."""
    windows = make_windows(token_stream(tokenizer, read_documents(path)), window)
    return windows if max_windows is None else windows[even_sample(len(windows), max_windows)]


def even_sample(count: int, size: int) -> torch.Tensor:
    """``size`` window indices evenly spaced over ``range(count)``, first and last included (all when
    ``size >= count``): a small sample sees every work of a split, not only the opening of the first."""
    if size < 1:
        raise UserError(f"--max-windows must be at least 1, got {size}")
    if size >= count:
        return torch.arange(count)
    return torch.linspace(0, count - 1, size, dtype=torch.float64).round().long()
