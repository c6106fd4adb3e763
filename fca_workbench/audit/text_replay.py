"""One text at a time: the frozen replays a live view asks for (the dashboard's eval window or pasted text), on the
engine's own pieces: the prefix cache (``prefix.PrefixCache``: the states before every layer, so a one-layer
replay starts there), what a condition assigns (``ReplaySession.assigned``, placed per controller as every replay
places values) and the audit's guard (``guard.require_finite``). Beside the full replay (``replay.py``) and the
per-layer sweep (``sweep.py``), it is the third way into the same engine, never a second one.

``TextReplays`` keeps the texts' prefix caches of any sessions in one store bounded by windows and bytes (one
browser session's share of memory); ``forget`` drops a session's, ``clear`` all.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fca_workbench.audit.assignment import Values, assigned_values, placed
from fca_workbench.audit.forward import forward_nll
from fca_workbench.audit.guard import applied_at, require_finite
from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.lexical import TokenPool
from fca_workbench.audit.prefix import PrefixCache, PrefixStore
from fca_workbench.audit.session import ReplaySession
from fca_workbench.results.conditions import condition_named


@dataclass(frozen=True)
class Text:
    """The tokens one replay runs on: an eval window of the session (``window``) or pasted text (None)."""

    ids: torch.Tensor  # [1, T]
    window: int | None

    @property
    def key(self) -> tuple[str, int | tuple[int, ...]]:
        return ("window", self.window) if self.window is not None else ("text", tuple(self.ids[0].tolist()))


def eval_values(session: ReplaySession, indices: torch.Tensor) -> Values:
    """Per controller, the values of the session's eval windows ``indices`` on the CPU: its eval cache's where it
    keeps one, else a live run of those windows (the dashboard's session keeps no cache)."""
    if session.cache_root is not None:
        return session.eval_cache.values(indices)
    with session.lock, torch.no_grad():
        values = forward_nll(session.model, session.windows(EVAL)[indices].to(session.device))[1]
    return [{name: t.cpu() for name, t in value.items()} for value in values]


class TextReplays:
    """Frozen replays of single texts on any sessions, their prefix caches kept in one bounded store."""

    def __init__(self, max_windows: int, max_bytes: int) -> None:
        self.store = PrefixStore(max_entries=max_windows, max_bytes=max_bytes)

    def prefix(self, session: ReplaySession, text: Text) -> PrefixCache:
        """The text's unperturbed run (its own values and NLL, the states before every layer), kept."""
        build = functools.partial(PrefixCache, session.model, text.ids, lock=session.lock)
        return self.store.get((session.serial, text.key), build)

    def values(
        self,
        session: ReplaySession,
        text: Text,
        condition: str,
        seed: int,
        donor: Text | None,
        controllers: Sequence[int] | None,
    ) -> Values:
        """Per controller, what ``condition`` assigns to the text (``donor``'s values, read when the condition asks
        for them; ``same_token``'s donors among the session's eval windows, ``eval_values``) at ``controllers`` only
        (indices) or everywhere, as the audit assigns them (``assigned_values``, the session's profiles), placed where
        the model replays them."""
        own = self.prefix(session, text).values
        given = None if donor is None else functools.partial(lambda donor: self.prefix(session, donor).values, donor)
        profiles = session.profiles_for([condition])
        slot_shapes = [tuple(s) for s in session.model.coefficient_slot_shapes]
        window = torch.tensor([-1 if text.window is None else text.window])
        pool = TokenPool(session.windows(EVAL), functools.partial(eval_values, session), session.batch_size)
        values = assigned_values(
            condition, own, given, profiles, slot_shapes, window, seed, controllers, text.ids, pool
        )
        return placed(session.model, values, session.device)

    def nll(
        self,
        session: ReplaySession,
        text: Text,
        condition: str,
        controllers: Sequence[int] | None,
        seed: int,
        donor: Text | None,
    ) -> torch.Tensor:
        """Per-token NLL ``[T-1]`` of the text under ``condition`` at ``controllers`` (indices; None: every
        controller); the live run
        (and any condition of a model without a controller) is the prefix's own. A NaN or inf is one line naming
        the condition and the text."""
        prefix = self.prefix(session, text)
        rows = prefix.nll
        if not condition_named(condition).live and session.has_controller:
            rows = prefix.replay_nll(self.values(session, text, condition, seed, donor, controllers), controllers)
        where = (None, "the pasted text") if text.window is None else ([text.window], "eval")
        require_finite(rows, "NLL", applied_at(condition, controllers), *where)
        return rows[0]

    def forget(self, session: ReplaySession) -> None:
        """Drop the prefix caches of ``session`` (its model being unloaded), which hold its model."""
        self.store.discard(lambda key: key[0] == session.serial)

    def clear(self) -> None:
        self.store.clear()

    def __len__(self) -> int:
        return len(self.store)

    @property
    def nbytes(self) -> int:
        return self.store.nbytes
