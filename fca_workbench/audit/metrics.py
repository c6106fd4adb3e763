"""Figures of an audit (docs/concepts.md): bootstrap CIs over windows, gap retention, and the
variance decomposition / variation of the coefficients.

Everything is computed in float64 and returned as plain Python floats so it can go straight into
``audit.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from fca_workbench.results.conditions import LOW, REFERENCE, condition_named

_F64 = torch.float64


def bootstrap_counts(n_windows: int, resamples: int = 1000, seed: int = 0) -> torch.Tensor:
    """``[R, N]`` int64: how often each window is drawn in each resample of N windows with
    replacement. Every figure is bootstrapped from the same counts, so comparisons between
    conditions are paired and reproducible from the seed alone."""
    if n_windows < 2:
        raise ValueError(f"bootstrap needs at least 2 windows, got {n_windows}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(n_windows, (resamples, n_windows), generator=gen)
    counts = torch.zeros(resamples, n_windows, dtype=torch.int64)
    return counts.scatter_add_(1, draws, torch.ones_like(draws))


def bootstrap_means(window_values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[R]`` means of each resample. Windows hold equally many tokens, so the mean over all
    tokens of a resample is the count-weighted mean of the per-window means."""
    values = torch.as_tensor(window_values, dtype=_F64)
    if values.shape != counts.shape[1:]:
        raise ValueError(f"window_values has shape {tuple(values.shape)}, counts expect [{counts.shape[1]}]")
    return counts.to(_F64) @ values / values.numel()


def _ci95(boot: torch.Tensor) -> list[float]:
    """2.5 / 97.5 percentiles; NaN resamples (0/0 ratios) are ignored."""
    lo, hi = torch.nanquantile(boot, torch.tensor([0.025, 0.975], dtype=_F64))
    return [lo.item(), hi.item()]


def mean_ci(window_values: torch.Tensor, counts: torch.Tensor) -> tuple[float, float, float]:
    """(mean, lo, hi): the plain mean and the percentile-bootstrap 95% interval."""
    point = torch.as_tensor(window_values, dtype=_F64).mean().item()
    lo, hi = _ci95(bootstrap_means(window_values, counts))
    return point, lo, hi


def condition_figures(
    window_nll: dict[str, torch.Tensor], counts: torch.Tensor, reference: str = REFERENCE
) -> dict[str, dict]:
    """Per condition: NLL with CI, and ΔNLL against ``reference`` with a *paired* CI (bootstrap
    of per-window differences), which removes the between-window variance both conditions share."""
    ref = torch.as_tensor(window_nll[reference], dtype=_F64)
    figures = {}
    for name, values in window_nll.items():
        values = torch.as_tensor(values, dtype=_F64)
        nll, lo, hi = mean_ci(values, counts)
        delta, dlo, dhi = mean_ci(values - ref, counts)
        figures[name] = {"nll": nll, "ci95": [lo, hi], "delta": delta, "delta_ci95": [dlo, dhi]}
    return figures


def gap_retention(
    window_nll: dict[str, torch.Tensor],
    profile: str,
    counts: torch.Tensor,
    low: str = LOW,
    reference: str = REFERENCE,
) -> dict:
    """Share of the ``low``→``reference`` NLL gap that static ``profile`` recovers, with both ends
    (docs/concepts.md): ``numerator`` = ΔNLL(low) − ΔNLL(profile) = NLL_low − NLL_profile, ``denominator`` =
    ΔNLL(low) = NLL_low − NLL_reference, each with its paired 95% CI, and ``reference``, the name of ``low``.
    ``value`` = numerator / denominator: 1 = as good as the live coefficients, 0 = no better than ``low``. Its
    CI recomputes the ratio on each resample (the same resamples as both ends). A gap whose CI holds 0 does not
    resolve: ``resolved`` false, ``value`` None and CI ``[None, None]`` (a ratio over noise is no figure); an end
    of a resolved ratio's CI the resamples leave unbounded is None, never an infinity."""
    names = (low, profile, reference)
    g, p, c = (torch.as_tensor(window_nll[n], dtype=_F64).mean() for n in names)
    bg, bp, bc = (bootstrap_means(window_nll[n], counts) for n in names)
    gap_ci = _ci95(bg - bc)
    denominator = {"value": (g - c).item(), "ci95": gap_ci}
    numerator = {"value": (g - p).item(), "ci95": _ci95(bg - bp)}
    resolved = bool(g != c) and (gap_ci[0] > 0 or gap_ci[1] < 0)
    value: float | None = None
    ci: list[float | None] = [None, None]
    if resolved:
        value = ((g - p) / (g - c)).item()
        ci = [end if math.isfinite(end) else None for end in _ci95((bg - bp) / (bg - bc))]
    return {
        "value": value,
        "ci95": ci,
        "resolved": resolved,
        "reference": low,
        "numerator": numerator,
        "denominator": denominator,
    }


def retention_figures(window_nll: dict[str, torch.Tensor], profiles: Iterable[str], counts: torch.Tensor) -> dict:
    """``retention`` of ``audit.json``: per profile its ``gap_retention`` against its condition's own reference
    (a router's top-k profile: the compute-matched ``random_topk``) where it was replayed, else against ``LOW``;
    one against another reference carries ``LOW``'s beside it, under ``other_references``."""
    figures = {}
    for profile in profiles:
        low = condition_named(profile).reference or LOW
        low = low if low in window_nll else LOW
        entry = gap_retention(window_nll, profile, counts, low)
        if low != LOW and LOW in window_nll:
            entry["other_references"] = {LOW: gap_retention(window_nll, profile, counts, LOW)}
        figures[profile] = entry
    return figures


def _grow(t: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad dim 0 of ``t`` up to ``size`` (positions and windows arrive incrementally)."""
    if t.shape[0] >= size:
        return t
    return torch.cat([t, t.new_zeros(size - t.shape[0], *t.shape[1:])])


def _ss(n: torch.Tensor, s: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    """Sum of squares about the mean from count, sum and sum of squares (rounding clamped at 0)."""
    return (sq - s * s / n).clamp(min=0)


def _within_ss(n: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """Total within-group SS from counts [G] and [sum, sum of squares] sums [G, 2, S];
    groups never seen (n = 0) contribute nothing."""
    return _ss(n.clamp(min=1).unsqueeze(-1), *sums.unbind(1)).sum()


def _pool(n: torch.Tensor, dev: torch.Tensor, ss: torch.Tensor):
    """Merge groups (count, mean, SS) into one (Chan et al.):
    SS = Σ SS_g + Σ n_g (mean_g − mean)², exact and free of the cancellation of sq − s²/n."""
    total = n.sum()
    mean = (n * dev).sum() / total
    return total, mean, ss.sum() + (n * (dev - mean) ** 2).sum()


class _LayerStats:
    """Sufficient statistics of one layer: per (position, slot) and per (window, slot) count,
    sum and sum of squares, of values shifted by the slot's first value (keeps the sums small
    so sq − s²/n does not cancel, and makes constant coefficients give exactly zero)."""

    def __init__(self, first: torch.Tensor):
        self.shift = first.reshape(-1).to(device="cpu", dtype=_F64)
        self.pos_n, self.win_n = torch.zeros(0, dtype=_F64), torch.zeros(0, dtype=_F64)
        # [group, (sum, sum of squares), slot] with group = position resp. window
        self.pos = torch.zeros(0, 2, self.shift.numel(), dtype=_F64)
        self.win = torch.zeros(0, 2, self.shift.numel(), dtype=_F64)

    def update(self, c: torch.Tensor, offset: int) -> None:
        b, t = c.shape[:2]
        if c[0, 0].numel() != self.shift.numel():
            raise ValueError(f"slot count changed from {self.shift.numel()} to {c[0, 0].numel()}")
        d = c.reshape(b, t, -1).to(_F64) - self.shift.to(c.device)
        self.pos_n, self.pos = _grow(self.pos_n, t), _grow(self.pos, t)
        self.win_n, self.win = _grow(self.win_n, offset + b), _grow(self.win, offset + b)
        self.pos_n[:t] += b
        self.win_n[offset : offset + b] += t
        self.pos[:t] += torch.stack([d.sum(0), (d * d).sum(0)], dim=1).cpu()
        self.win[offset : offset + b] += torch.stack([d.sum(1), (d * d).sum(1)], dim=1).cpu()

    def slots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per slot: count [S], mean [S] and within-slot SS [S]."""
        n = self.pos_n.sum().expand_as(self.shift)
        s, sq = self.pos.sum(0)
        return n, self.shift + s / n, _ss(n, s, sq)


class VarianceAccumulator:
    """Streams the eval set's coefficients batch by batch (they do not fit in memory for big
    models) and reports how much of their variance static structure explains (docs/concepts.md):
    R² = 1 − SS_within / SS_total over all entries of all layers pooled, for the groupings layer;
    layer×slot; layer×slot×position; layer×slot×window. What is left is token content."""

    def __init__(self, origin: list[torch.Tensor] | None = None):
        """``origin``: per layer, a value of every slot (``[*slot_shape]``) to shift by; by default the first
        token's. Accumulators that share it (one per process, each on part of the windows) can be combined."""
        self.layers: list[_LayerStats] = [_LayerStats(o.detach()) for o in origin] if origin is not None else []

    def combine(self, total: Callable[[torch.Tensor], torch.Tensor], windows: int) -> None:
        """Sums over every process's windows: ``total`` adds a tensor up over the processes (e.g.
        ``distributed.Ranks.sum``); ``windows`` is the number of all of them."""
        for stats in self.layers:
            stats.win_n, stats.win = _grow(stats.win_n, windows), _grow(stats.win, windows)
            for name in ("pos_n", "pos", "win_n", "win"):
                setattr(stats, name, total(getattr(stats, name)))

    def update(self, coefficients: list[torch.Tensor], window_offset: int) -> None:
        """``coefficients[l]``: layer l's ``[B, T, *slot_shape_l]`` for windows
        ``window_offset .. window_offset + B - 1``."""
        if not self.layers:
            self.layers = [_LayerStats(c[0, 0].detach()) for c in coefficients]
        if len(coefficients) != len(self.layers):
            raise ValueError(f"got {len(coefficients)} layers, expected {len(self.layers)}")
        for stats, c in zip(self.layers, coefficients):
            stats.update(c.detach(), window_offset)

    def result(self) -> dict | None:
        """The §6 ``variance`` and ``variation`` figures; None for a model without coefficients."""
        if not self.layers:
            return None
        per_slot = [stats.slots() for stats in self.layers]
        # Means are offset from one common value so identical means subtract to exactly 0.
        origin = per_slot[0][1][0]
        layers = [_pool(n, mean - origin, ss) for n, mean, ss in per_slot]
        _, _, ss_total = _pool(*(torch.stack(col) for col in zip(*layers)))
        within = {
            "r2_layer": sum(ss for _, _, ss in layers),
            "r2_layer_slot": sum(ss.sum() for _, _, ss in per_slot),
            "r2_layer_slot_position": sum(_within_ss(s.pos_n, s.pos) for s in self.layers),
            "r2_layer_slot_window": sum(_within_ss(s.win_n, s.win) for s in self.layers),
        }
        r2 = {k: None if ss_total == 0 else (1 - v / ss_total).item() for k, v in within.items()}

        stds = [(ss / n).sqrt() for n, _, ss in per_slot]
        # A slot that never varies has CV 0, even where its mean is 0.
        cvs = [torch.where(sd == 0, 0.0, sd / m.abs()) for sd, (_, m, _) in zip(stds, per_slot)]
        return {
            **r2,
            "within_std": torch.cat(stds).mean().item(),
            "cv": torch.cat(cvs).mean().item(),
            "within_std_per_layer": [sd.mean().item() for sd in stds],
        }
