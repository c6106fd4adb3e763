"""What torchrun's environment says about this process: whether it is one rank of several, and how it reports a
user error. No torch here: the command line refuses a bad flag, on the right ranks, before torch is imported."""

import os

from fca_workbench.foundation.errors import UserError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class EveryRankError(UserError):
    """A problem every rank finds alike (ranks disagree, more ranks than shards, a locked cache folder):
    the command line reports it once, on rank 0."""


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def error_prefix(exc: Exception) -> str | None:
    """How this process reports ``exc`` on the command line: ``""`` or ``"rank N: "`` (a problem of this rank
    alone), or None where rank 0 reports it for every rank."""
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return ""
    if isinstance(exc, EveryRankError):
        return "" if os.environ["RANK"] == "0" else None
    return f"rank {os.environ['RANK']}: "
