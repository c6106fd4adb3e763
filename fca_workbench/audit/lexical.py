"""Token identity: the per-token static profile ``layer_token_mean`` and the ``same_token`` donors.

Both ask whether a controller's coefficients depend on the *token* (a lookup table would do, as in hash routing) or
on the *context*. ``layer_token_mean`` is, per layer, slot and token id, the calibration set's mean coefficient,
shrunk toward ``layer_mean`` for tokens seen rarely; for a router its top k, as ``layer_mean_topk`` is built from
``layer_mean``. ``same_token`` gives each position the values another eval window computed at a position holding
the same token id. Pure, seeded functions of token ids and coefficient tensors; none touches a model.
"""

from collections.abc import Callable, Iterable

import torch

from fca_workbench.audit.interventions import layer_mean_topk
from fca_workbench.results.conditions import LAYER_MEAN, LAYER_TOKEN_MEAN, Values, condition_named

PRIOR_WEIGHT = 4.0
"""m, the shrinkage's prior weight in occurrences: a token seen n times in the calibration set gets
``(n·token_mean + m·layer_mean) / (n + m)``. With m = 4 a token seen once keeps 1/5 of its own mean and one seen 36
times 9/10: a single occurrence is one context's coefficient, as noisy as the spread within a layer, so it should
not stand for the token, while a token seen dozens of times (the function words that make up most text) is
estimated well enough to keep nearly all of its own. A token never seen gets ``layer_mean`` exactly."""

TOKEN_IDS = "token_ids"  # a profiles entry, not a condition: the calibration's distinct token ids, sorted, per layer


def vocabulary(windows: torch.Tensor) -> torch.Tensor:
    """The distinct token ids of ``windows``, sorted: the rows of a per-token profile (every process reads every
    calibration window, so every process gets the same rows)."""
    return torch.unique(windows)


class TokenSums:
    """Per layer, the float64 sum of the coefficients at each token id of ``ids`` ``[U, *slot]``, and how often each
    id occurs ``[U]``: what ``layer_token_mean`` is made of, and what processes that each saw some windows add up."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self.sums: list[torch.Tensor] | None = None
        self.counts = torch.zeros(len(ids), dtype=torch.float64)

    def add(self, tokens: torch.Tensor, coefficients: list[torch.Tensor]) -> None:
        """Windows ``tokens`` ``[B, T]`` and their per-layer coefficients ``[B, T, *slot]``."""
        rows = torch.searchsorted(self.ids, tokens.reshape(-1).cpu())
        if self.sums is None:
            self.sums = [torch.zeros(len(self.ids), *c.shape[2:], dtype=torch.float64) for c in coefficients]
        for total, c in zip(self.sums, coefficients):
            total.index_add_(0, rows, c.detach().reshape(-1, *c.shape[2:]).cpu().double())
        self.counts.index_add_(0, rows, torch.ones(len(rows), dtype=torch.float64))

    def seen(self, batches: Iterable[tuple[torch.Tensor, list[torch.Tensor]]]) -> Iterable[list[torch.Tensor]]:
        """The coefficients of ``(tokens, coefficients)`` batches, each added here as it passes."""
        for tokens, coefficients in batches:
            self.add(tokens, coefficients)
            yield coefficients

    def totals(self, total: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The sums and counts added up over the processes (``total``: ``distributed.Ranks.sum``)."""
        if self.sums is None:
            raise ValueError("a per-token profile needs at least one calibration window")
        return [total(s) for s in self.sums], total(self.counts)


def shrunk_means(
    sums: list[torch.Tensor], counts: torch.Tensor, layer_mean: list[torch.Tensor], prior: float = PRIOR_WEIGHT
) -> list[torch.Tensor]:
    """Per layer ``[U + 1, *slot]``: each token's mean shrunk toward the layer mean,
    ``(n·token_mean + m·layer_mean) / (n + m) = (sum + m·layer_mean) / (n + m)``, and a last row for a token the
    calibration set never held (n = 0: the layer mean)."""
    out = []
    for total, mean in zip(sums, layer_mean):
        n = counts.view(-1, *[1] * (total.dim() - 1))
        rows = (total + prior * mean.double()) / (n + prior)
        out.append(torch.cat([rows, mean.double().unsqueeze(0)]).float())
    return out


def with_token_profile(
    profiles: dict, ids: torch.Tensor, sums: list[torch.Tensor], counts: torch.Tensor, top_k: list[int | None]
) -> dict:
    """``profiles`` plus ``layer_token_mean`` (``shrunk_means``; a router's rows cut to their top k and rescaled as
    ``layer_mean_topk`` cuts ``layer_mean``) and the token ids its rows belong to (``TOKEN_IDS``, per layer)."""
    means = shrunk_means(sums, counts, profiles[LAYER_MEAN])
    profiles[LAYER_TOKEN_MEAN] = layer_mean_topk(means, top_k)
    profiles[TOKEN_IDS] = [ids.clone() for _ in means]
    return profiles


def look_up(table: list[torch.Tensor], ids: list[torch.Tensor], tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per layer ``[B, T, *slot]``: the row of ``table`` (``[U + 1, *slot]``, rows for the sorted ``ids``, then the
    row for unseen tokens) of each token of ``tokens`` ``[B, T]``."""
    out = []
    for rows, known in zip(table, ids):
        index = torch.searchsorted(known, tokens).clamp(max=len(known) - 1)
        index = torch.where(known[index] == tokens, index, len(known))
        out.append(rows[index])
    return out


def same_token_donors(
    tokens: torch.Tensor, windows: torch.Tensor, pool: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of ``tokens`` ``[B, T]`` (eval windows ``windows`` ``[B]``, or -1: a text that is none of them),
    its donor in ``pool`` (every eval window's tokens ``[N, T']``): ``(window, position)``, each ``[B, T]``, drawn
    uniformly among the pool's positions that hold the same token id in another window, seeded by (seed, window),
    so a window's donors do not depend on its batch. A position whose token no other window holds is its own donor
    (window -1 for a text outside the pool)."""
    length = pool.shape[1]
    flat = pool.reshape(-1)
    order = torch.argsort(flat, stable=True)  # by token, then window, then position
    keys = flat[order] * len(pool) + order // length  # token and window, sorted
    token_keys, own_keys = tokens * len(pool), tokens * len(pool) + windows.unsqueeze(1)
    start = torch.searchsorted(keys, token_keys)
    end = torch.searchsorted(keys, token_keys + len(pool))
    inside = (windows >= 0).unsqueeze(1)
    own_start = torch.where(inside, torch.searchsorted(keys, own_keys), start)
    own_end = torch.where(inside, torch.searchsorted(keys, own_keys, right=True), start)
    candidates = (end - start) - (own_end - own_start)
    draws = torch.stack([uniform(seed, int(w), tokens.shape[1]) for w in windows])
    pick = start + (draws * candidates).long().clamp(max=(candidates - 1).clamp(min=0))
    pick = torch.where(pick >= own_start, pick + (own_end - own_start), pick)
    donor = order[pick.clamp(max=len(flat) - 1)]
    kept = candidates == 0
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    donor_window = torch.where(kept, windows.unsqueeze(1).expand_as(tokens), donor // length)
    return donor_window, torch.where(kept, positions, donor % length)


def uniform(seed: int, window: int, length: int) -> torch.Tensor:
    """``[length]`` uniform draws in [0, 1) seeded by (seed, window)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + window) * 7_919 + 1)
    return torch.rand(length, generator=generator, dtype=torch.float64)


def kept_own(tokens: torch.Tensor, seed: int) -> int:
    """How many positions of eval windows ``tokens`` ``[N, T]`` keep their own values under ``same_token``: their
    token is in no other window."""
    windows = torch.arange(len(tokens))
    donor_window, _ = same_token_donors(tokens, windows, tokens, seed)
    return int((donor_window == windows.unsqueeze(1)).sum())


def with_kept_own(figures: dict, tokens: torch.Tensor, seed: int) -> dict:
    """``figures`` (``replay_figures``) with ``kept_own`` (``kept_own`` of eval windows ``tokens``) in the entry of
    every condition that reads ``same_token``."""
    reading = [entry for name, entry in figures["conditions"].items() if condition_named(name).uses_same_token]
    kept = kept_own(tokens, seed) if reading else 0
    for entry in reading:
        entry["kept_own"] = kept
    return figures


def donor_values(
    own: Values,
    donors: tuple[torch.Tensor, torch.Tensor],
    windows: torch.Tensor,
    read: Callable[[torch.Tensor], Values],
    chunk: int,
) -> Values:
    """Per controller, ``own`` ``[B, T, ...]`` (of eval windows ``windows``, or -1) with each position's values
    replaced by its donor's (``same_token_donors``: window and position); ``read`` gives the values of eval windows,
    asked for ``chunk`` windows at a time, so memory holds one chunk of them; a position that is its own donor keeps
    its own values."""
    donor_window, donor_position = donors
    out = [{name: t.clone() for name, t in value.items()} for value in own]
    moved = donor_window != windows.unsqueeze(1)
    needed = donor_window[moved].unique()
    for start in range(0, len(needed), chunk):
        part = needed[start : start + chunk]
        where = moved & torch.isin(donor_window, part)
        rows = torch.searchsorted(part, donor_window[where])
        for target, source in zip(out, read(part)):
            for name, t in target.items():
                t[where] = source[name][rows, donor_position[where]].to(t.dtype)
    return out


class TokenPool:
    """The eval windows as ``same_token``'s donors: their token ids ``[N, T]`` and ``read``, which gives the values
    of any of them (the eval cache's, or a live run's), ``chunk`` windows at a time."""

    def __init__(self, tokens: torch.Tensor, read: Callable[[torch.Tensor], Values], chunk: int) -> None:
        self.tokens, self.read, self.chunk = tokens, read, chunk

    def values(self, own: Values, tokens: torch.Tensor, windows: torch.Tensor, seed: int) -> Values:
        """Per controller, what ``same_token`` gives texts ``tokens`` ``[B, T]`` (eval windows ``windows``, or -1)
        whose own values are ``own``."""
        donors = same_token_donors(tokens, windows, self.tokens, seed)
        return donor_values(own, donors, windows, self.read, self.chunk)
