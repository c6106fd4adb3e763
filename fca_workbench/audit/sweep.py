"""Per-layer sweep: every reassignment condition applied at one layer alone, the other layers ``correct``.

It answers which layer's content-conditioned assignment carries a model's dependence. Each row is the
frozen replay of one (layer, condition), ΔNLL against ``correct`` with a paired bootstrap over windows.

Prefix reuse: per batch of windows, one frozen pass with the cached ``correct`` coefficients keeps the state
before every layer (``prefix.PrefixCache``); each (layer, condition) resumes from
``model.resume_layer(layer)``, so the layers before it are never recomputed, and the conditions at one layer
run from that state as one batch where memory allows. Memory is bounded by one batch's states. Every model the
workbench loads steps by layer, a transformers model too (``adapters.stepping``); a ``ControlledModel`` without
it (not a ``SteppingModel``) falls back to full frozen forwards, ``replay_nll(..., layer=l)``.
Both modes give the rows of full one-layer replays (tested within 1e-6). Both check what the audit checks
(``guard``): every NLL finite, and the sweep's ``correct`` reproducing the cached unperturbed run.
"""

from collections.abc import Iterable, Sequence

import torch

from fca_workbench.adapters.protocol import ControlledModel, SteppingModel
from fca_workbench.audit.assignment import ConditionCoefficients, Profiles, placed
from fca_workbench.audit.budget import conditions_per_pass
from fca_workbench.audit.capture import CoefficientCache
from fca_workbench.audit.guard import at_layer, check_correct_replay, require_finite
from fca_workbench.audit.interventions import restrict_to_layer
from fca_workbench.audit.metrics import condition_figures
from fca_workbench.audit.prefix import PrefixCache
from fca_workbench.audit.replay import replay_nll
from fca_workbench.foundation.progress import progress
from fca_workbench.results.conditions import REFERENCE

PREFIX, FULL_FORWARD = "prefix", "full_forward"


def sweep_mode(model: ControlledModel) -> str:
    """``prefix`` for models with the layer-stepping API, else ``full_forward`` (recorded in ``settings``)."""
    return PREFIX if isinstance(model, SteppingModel) else FULL_FORWARD


def per_layer_sweep(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    conditions: Sequence[str],
    profiles: Profiles | None,
    seed: int,
    counts: torch.Tensor,
    device: torch.device | str = "cpu",
    group: int | None = None,
) -> list[dict]:
    """Rows ``{"layer", "condition", "nll", "delta", "delta_ci95"}``, layer by layer, conditions in order.

    ``counts``: the audit's bootstrap counts, so the CIs are paired with every other figure. ``group``: how
    many conditions at one layer run as one batch (None: fitted to the device, ``conditions_per_pass``).
    """
    if not conditions:
        return []
    return per_layer_rows(
        *per_layer_window_nll(model, windows, cache, conditions, profiles, seed, device, group), counts
    )


def per_layer_window_nll(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    conditions: Sequence[str],
    profiles: Profiles | None,
    seed: int,
    device: torch.device | str = "cpu",
    group: int | None = None,
    shards: Iterable[int] | None = None,
) -> tuple[dict[tuple[int, str], torch.Tensor], torch.Tensor]:
    """Per-window mean NLL ``{(layer, condition): [N]}`` and that of ``correct``, in the model's sweep mode;
    with ``shards`` (one rank's share), of those shards' windows only."""
    if sweep_mode(model) == PREFIX:
        return prefix_window_nll(model, windows, cache, conditions, profiles, seed, device, group, shards)
    return full_forward_window_nll(model, windows, cache, conditions, profiles, seed, device, shards)


def per_layer_rows(window_nll: dict, correct: torch.Tensor, counts: torch.Tensor) -> list[dict]:
    """The sweep's rows from the per-window NLLs of every window, ΔNLL CIs paired by ``counts``."""
    rows = []
    for (layer, condition), values in window_nll.items():
        figures = condition_figures({REFERENCE: correct, condition: values}, counts)[condition]
        rows.append({"layer": layer, "condition": condition, **{k: figures[k] for k in ("nll", "delta", "delta_ci95")}})
    return rows


@torch.no_grad()
def prefix_window_nll(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    conditions: Sequence[str],
    profiles: Profiles | None,
    seed: int,
    device: torch.device | str,
    group: int | None = None,
    shards: Iterable[int] | None = None,
) -> tuple[dict[tuple[int, str], torch.Tensor], torch.Tensor]:
    """Per-window mean NLL ``{(layer, condition): [N]}`` and that of ``correct``, by prefix reuse.

    Batches follow the cache's shards, as in ``replay_nll``, so the arithmetic is the full forward's.
    """
    assigners = {c: ConditionCoefficients(c, cache, profiles, seed, tokens=windows) for c in conditions}
    model.eval()
    parts: dict[tuple[int, str], list[torch.Tensor]] = {
        (layer, c): [] for layer in range(cache.num_layers) for c in conditions
    }
    correct: list[torch.Tensor] = []
    for indices in progress(list(cache.shard_indices(shards)), desc="per-layer", unit="batch", leave=False):
        batch = windows[indices].to(device)
        own = placed(model, cache.values(indices), device)
        prefix = PrefixCache(model, batch, coefficients=own)
        require_finite(prefix.nll, "NLL", REFERENCE, indices)
        check_correct_replay(prefix.nll.cpu(), cache.nll(indices), model.replay_tolerance, indices)
        correct.append(prefix.nll.double().mean(dim=1).cpu())
        intervened = {c: placed(model, assign.values(indices), device) for c, assign in assigners.items()}
        size = group or conditions_per_pass(model, batch, len(conditions), device)
        for layer in range(cache.num_layers):
            for start in range(0, len(conditions), size):
                names = conditions[start : start + size]
                variants = [restrict_to_layer(intervened[c], own, layer) for c in names]
                nll = prefix.replay_nll_many(variants, layer).double().mean(dim=2).cpu()
                for name, values in zip(names, nll):
                    require_finite(values, "NLL", at_layer(name, layer), indices)
                    parts[(layer, name)].append(values)
        del prefix, intervened  # one batch's states at a time
    return {key: torch.cat(values) for key, values in parts.items()}, torch.cat(correct)


def full_forward_window_nll(
    model: ControlledModel,
    windows: torch.Tensor,
    cache: CoefficientCache,
    conditions: Sequence[str],
    profiles: Profiles | None,
    seed: int,
    device: torch.device | str,
    shards: Iterable[int] | None = None,
) -> tuple[dict[tuple[int, str], torch.Tensor], torch.Tensor]:
    """The same figures from full frozen forwards, for models without layer stepping."""

    def window_mean(condition, layer=None):
        nll = replay_nll(model, windows, cache, condition, profiles, seed, layer=layer, device=device, shards=shards)
        return nll.double().mean(dim=1)

    window_nll = {(layer, c): window_mean(c, layer) for layer in range(cache.num_layers) for c in conditions}
    correct = replay_nll(model, windows, cache, REFERENCE, profiles, seed, device=device, shards=shards)
    indices = torch.cat(list(cache.shard_indices(shards)))
    check_correct_replay(correct, cache.nll(indices), model.replay_tolerance, indices)
    return window_nll, correct.double().mean(dim=1)
