"""Audits on several processes: the ranks and their collectives (torchrun, torch.distributed; what torchrun's
environment alone says is ``torchrun``).

``torchrun`` starts the processes and sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` and the rendezvous;
``process_group`` joins them (gloo on CPU; NCCL with ``--device cuda``, each rank on ``cuda:LOCAL_RANK``).
``Ranks`` gives each rank its contiguous share of a cache's shards and wraps the few collectives an audit
needs: sums (static profiles, variance decomposition), per-window results gathered to rank 0, and a check
that every rank loaded the same model, data and settings. Outside torchrun there is one rank, no process
group, and every collective is the identity, so a single-process audit runs exactly as before.
"""

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from fca_workbench.audit.torchrun import TORCHRUN_VARIABLES, EveryRankError, under_torchrun
from fca_workbench.foundation.errors import UserError

T = TypeVar("T")


def _short(value) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 else text  # sha256 fingerprints: their first 12 hex digits


def _join(parts: list):
    """Tensors, or dicts / tuples of them, from every rank in rank order: one of the same shape, rows joined."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: _join([part[key] for part in parts]) for key in first}
    if isinstance(first, tuple):
        return tuple(_join(list(column)) for column in zip(*parts))
    return torch.cat(parts)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks, and the collectives an audit uses (identities on one rank)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collectives run

    @property
    def lead(self) -> bool:
        """Rank 0: the one rank that computes the bootstrap and execution figures, prints and writes files."""
        return self.rank == 0

    def share(self, count: int) -> range:
        """This rank's contiguous part of ``count`` shards; the first ``count % world_size`` ranks take one more.
        Shares in rank order are the shards in order, so gathered results need no reordering."""
        base, extra = divmod(count, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of ``tensor`` over all ranks, on every rank."""
        if self.world_size == 1:
            return tensor
        total = tensor.to(self.device, copy=True)
        torch.distributed.all_reduce(total)
        return total.to(tensor.device)

    def gather(self, part: Any) -> Any:
        """On rank 0, every rank's ``part`` (tensors holding the rows of its share, alone or in dicts and
        tuples) joined in rank order along dim 0; None on the other ranks."""
        if self.world_size == 1:
            return part
        if not self.lead:
            torch.distributed.gather_object(part, None, dst=0)
            return None
        parts: list[Any] = [None] * self.world_size
        torch.distributed.gather_object(part, parts, dst=0)
        return _join(parts)

    def from_lead(self, value: T) -> T:
        """Rank 0's ``value`` (anything picklable), on every rank."""
        if self.world_size == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def smallest(self, value: int) -> int:
        """The smallest ``value`` any rank has (e.g. the batch size that fits every GPU)."""
        if self.world_size == 1:
            return value
        values: list[int] = [value] * self.world_size
        torch.distributed.all_gather_object(values, value)
        return min(values)

    def agree(self, facts: Callable[[], dict]) -> None:
        """Stop every rank (``EveryRankError``, nothing written) unless all ranks have the same ``facts()``
        (fingerprints of the model and data, the settings); computed only when there are other ranks."""
        if self.world_size == 1:
            return
        everyone: list[dict] = [{}] * self.world_size
        torch.distributed.all_gather_object(everyone, facts())
        for rank, theirs in enumerate(everyone[1:], 1):
            for key, value in everyone[0].items():
                if theirs.get(key) != value:
                    raise EveryRankError(
                        f"ranks disagree about the {key}: rank 0 has {_short(value)}, rank {rank} has "
                        f"{_short(theirs.get(key))}; every rank must load the same model, data and settings"
                    )

    def check_shards(self, shards: dict[str, int]) -> None:
        """Every rank needs at least one shard of each set (``shards``: set name -> number of shards)."""
        for name, count in shards.items():
            if count < self.world_size:
                raise EveryRankError(
                    f"{self.world_size} ranks, but the {name} set makes only {count} shard(s) of windows; "
                    f"run at most {count} ranks, or give a smaller --batch-size"
                )


SINGLE = Ranks()


def quiet_progress_bars() -> None:
    """Progress bars on rank 0 only: tqdm reads ``TQDM_DISABLE`` when it is imported, before the rank is
    known, so its default is changed here instead."""
    from tqdm import std

    std.tqdm.__init__ = functools.partialmethod(std.tqdm.__init__, disable=True)


@contextmanager
def process_group(device: str = "cpu") -> Iterator[Ranks]:
    """This process's ``Ranks``: under torchrun, joined to the others for the duration (gloo on CPU, NCCL
    with ``--device cuda`` on ``cuda:LOCAL_RANK``); outside it, ``SINGLE`` and no process group."""
    if not under_torchrun():
        yield SINGLE
        return
    rank, world_size, local_rank = (int(os.environ[name]) for name in TORCHRUN_VARIABLES)
    if device.startswith("cuda"):
        if device != "cuda":
            raise EveryRankError(f"under torchrun give --device cuda, not {device}: each rank uses cuda:LOCAL_RANK")
        if torch.cuda.device_count() <= local_rank:
            raise UserError(f"LOCAL_RANK {local_rank}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
        where = torch.device("cuda", local_rank)
        torch.cuda.set_device(where)  # "cuda" now means this rank's GPU everywhere in the audit
        torch.distributed.init_process_group("nccl", device_id=where)
    else:
        where = torch.device("cpu")
        torch.distributed.init_process_group("gloo")
    if rank != 0:
        quiet_progress_bars()
    try:
        yield Ranks(rank, world_size, where)
    finally:
        torch.distributed.destroy_process_group()
