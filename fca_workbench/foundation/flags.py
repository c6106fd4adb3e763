"""The command lines' number types (and ``--shard K/N``): every numeric flag of ``fca`` and ``panel serve ...
--args`` is parsed by one of these, so a value out of range is one line naming the flag before any work (never a
``ZeroDivisionError`` from ``--batch-size 0`` or a silent default for ``--window 0``); every size of memory
(``--max-memory cpu=200MB``) by ``byte_size`` (never an ``OverflowError`` from ``infGB``)."""

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import NamedTuple, TypeVar

Item = TypeVar("Item")

SEED_MAX = 2**32 - 1  # numpy's and torch's generators both take it
BYTES_MAX = 1 << 50  # 1 PiB: more memory than any one device or machine has


def bounded(kind: type, minimum: float | None = None, maximum: float | None = None) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind`` (``int`` or ``float``, finite) within ``[minimum, maximum]``; anything else
    an ``argparse.ArgumentTypeError`` (argparse adds the flag's name)."""
    what = "a whole number" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above 0 (a learning rate)."""
    value = float(bounded(float, 0.0)(text))
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


positive_int = bounded(int, 1)  # counts: steps, windows, batch sizes, threads
non_negative_int = bounded(int, 0)  # counts where 0 means "none" or "no limit"
non_negative_float = bounded(float, 0.0)  # seconds
window_size = bounded(int, 2)  # tokens per window: a next-token NLL needs two
seed = bounded(int, 0, SEED_MAX)
port = bounded(int, 1, 65535)


class Shard(NamedTuple):
    """``--shard K/N``: the K-th (0-based) of N processes sharing a plan of work, each taking every N-th item
    from its K-th, so N nodes split it without talking to one another (the same plan gives the same split)."""

    position: int
    total: int

    def take(self, items: Iterable[Item]) -> list[Item]:
        return list(items)[self.position :: self.total]

    def __str__(self) -> str:
        return f"{self.position}/{self.total}"


def shard(text: str) -> Shard:
    """An argparse ``type``: ``K/N`` with ``0 <= K < N`` (``Shard``)."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}")
    return Shard(int(index), int(count))


def byte_size(text: str) -> int:
    """A size of memory in bytes, written as accelerate reads one (``200MB``, ``10GiB``, ``1.5GB``): finite,
    above 0 and at most ``BYTES_MAX``; anything else an ``argparse.ArgumentTypeError`` saying why. accelerate
    imports torch, so it is imported here, by the one command that places a model, not by every parse."""
    from accelerate.utils import convert_file_size_to_int

    try:
        size = convert_file_size_to_int(text)
    except (ValueError, OverflowError):  # OverflowError: infGB, 1e400GB (a float infinity)
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a size (like 200MB, 10GiB)") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a size above 0 bytes")
    if size > BYTES_MAX:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is more than {BYTES_MAX >> 50} PiB, more than any device holds"
        )
    return size


def declared_default(settings: type, name: str) -> object:
    """The default the dataclass ``settings`` declares for field ``name``: what a flag offers when none is given,
    read from the one declaration rather than restated."""
    found = {f.name: f.default for f in dataclasses.fields(settings)}
    if name not in found or found[name] is dataclasses.MISSING:
        raise KeyError(f"{settings.__name__} declares no default for {name!r}")
    return found[name]
