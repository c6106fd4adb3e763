"""Every progress bar of the package: tqdm's own bar on a terminal or in a notebook, plain lines elsewhere.

A log that is not a terminal (a batch job, CI, a pipe) cannot take tqdm's carriage returns and the cursor
moves of nested bars; there each bar writes whole lines instead, at most one per ``LOG_INTERVAL`` seconds
besides its last, and none before its first step (a refusal at the start stays the run's one line).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import std
from tqdm.auto import tqdm as auto_tqdm
from tqdm.autonotebook import tqdm as notebook_tqdm  # tqdm.auto imported it first, warnings silenced

T = TypeVar("T")

LOG_INTERVAL = 30.0  # seconds between two lines of one bar in a log


class PlainLines(std.tqdm):
    """tqdm writing one whole line per refresh: no carriage return, no cursor movement, no clearing."""

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "":  # tqdm clears a finished bar this way; a log keeps its lines
            return False
        if msg is None and self.n == self.initial:  # nothing done yet: a "0/N" line says nothing
            return False
        self.fp.write(f"{self.__str__() if msg is None else msg}\n")
        self.fp.flush()
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing to clear: every line written stays (``tqdm.write`` calls this around its message)."""

    def close(self) -> None:
        """The last state as one line (unless it was just written), without tqdm's closing newline."""
        if getattr(self, "disable", True):
            return
        if self.n != self.last_print_n:
            self.display()
        self.disable = True
        self._decr_instances(self)


def progress(iterable: Iterable[T] | None = None, **options: Any) -> std.tqdm:
    """A tqdm bar over ``iterable`` (tqdm's keyword options): tqdm.auto's in a notebook or on a terminal,
    ``PlainLines`` when the bar's file (standard error by default) is not a terminal."""
    file = options.get("file") or sys.stderr
    if notebook_tqdm is not std.tqdm or _is_terminal(file):
        return auto_tqdm(iterable, **options)
    return PlainLines(iterable, **{"mininterval": LOG_INTERVAL, "ascii": True, **options})


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
