"""What one live query runs on: an eval window of the checkpoint, or pasted text checked and cut to one window."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fca_workbench.foundation.errors import UserError

MAX_PASTE_CHARS = 4000  # pasted text longer than this is refused with a message


class TextSource(Protocol):
    """What an input needs of a loaded checkpoint (a ``live.SharedModel``): its eval windows, tokenizer and
    window length."""

    eval_windows: torch.Tensor
    tokenizer: Any
    window: int


@dataclass(frozen=True)
class TextInput:
    """The tokens one query runs on: an eval window (``window_index``) or pasted text (None)."""

    ids: torch.Tensor  # [1, T]
    window_index: int | None
    note: str = ""

    @property
    def key(self) -> tuple[str, int | tuple[int, ...]]:
        return ("window", self.window_index) if self.window_index is not None else ("text", tuple(self.ids[0].tolist()))


def window_input(shared: TextSource, index: object) -> TextInput:
    count = len(shared.eval_windows)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < count:
        raise UserError(f"eval window {index!r} does not exist: choose 0..{count - 1}")
    return TextInput(shared.eval_windows[int(index)].unsqueeze(0), int(index))


def pasted_input(shared: TextSource, text: object) -> TextInput:
    """Validate pasted text: non-empty, at most ``MAX_PASTE_CHARS`` characters, text (no control characters
    but newline and tab), at least 2 tokens; cut to the eval window length, with a note."""
    if not isinstance(text, str):
        raise UserError("pasted input is not text")
    if not text.strip():
        raise UserError("pasted text is empty")
    if len(text) > MAX_PASTE_CHARS:
        raise UserError(f"pasted text has {len(text):,} characters; the limit is {MAX_PASTE_CHARS:,}")
    bad = [ch for ch in text if ch not in "\n\r\t" and unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn")]
    if bad:
        raise UserError(
            f"pasted input is not plain text (it contains {len(bad)} control or invalid characters, e.g. U+{ord(bad[0]):04X})"
        )
    ids = shared.tokenizer(text)["input_ids"]
    if len(ids) < 2:
        raise UserError("pasted text is a single token; NLL needs at least 2")
    note = ""
    if len(ids) > shared.window:
        note = f"pasted text has {len(ids)} tokens; only the first {shared.window} (one window) are scored"
        ids = ids[: shared.window]
    return TextInput(torch.tensor([ids], dtype=torch.long), None, note)
