"""Per-layer sweep: every reassignment condition applied at one decoder layer alone, the other layers ``correct``.

It answers which layer's content-conditioned assignment carries a model's dependence. A layer means a decoder
layer: its row intervenes on every controller that sits in it together (``adapters.sites``); where a layer holds
more than one controller (a router and a shared-expert gate), each controller alone has a row too, named by its
module path. Each row is the frozen replay of one (site, condition), ΔNLL against ``correct`` with a paired
bootstrap over windows.

Prefix reuse: per batch of windows, one frozen pass with the cached ``correct`` coefficients keeps the state
before every layer (``prefix.PrefixCache``); each (site, condition) resumes from the earliest
``model.resume_layer(c)`` of the site's controllers, so the layers before it are never recomputed, and the
conditions at one site run from that state as one batch where memory allows. Memory is bounded by one batch's
states. Every model the workbench loads steps by layer, a transformers model too (``adapters.stepping``); a
``ControlledModel`` without it (not a ``SteppingModel``) falls back to full frozen forwards,
``replay_nll(..., controllers=...)``. Both modes give the rows of full frozen replays with the site's
controllers intervened (tested within 1e-6). Both check what the audit checks (``guard``): every NLL finite, and
the sweep's ``correct`` reproducing the cached unperturbed run.
"""

from collections.abc import Iterable, Sequence

import torch

from fca_workbench.adapters.protocol import ControlledModel, SteppingModel
from fca_workbench.adapters.sites import Site, sites
from fca_workbench.audit.assignment import ConditionCoefficients, Profiles, placed
from fca_workbench.audit.budget import conditions_per_pass
from fca_workbench.audit.capture import CoefficientCache
from fca_workbench.audit.guard import applied_at, check_correct_replay, require_finite
from fca_workbench.audit.interventions import restrict_to
from fca_workbench.audit.metrics import condition_figures
from fca_workbench.audit.prefix import PrefixCache
from fca_workbench.audit.replay import replay_nll
from fca_workbench.foundation.progress import progress
from fca_workbench.results.conditions import REFERENCE

PREFIX, FULL_FORWARD = "prefix", "full_forward"
FIGURES = ("nll", "delta", "delta_ci95")
WindowNLL = dict[tuple[Site, str], torch.Tensor]  # per (site, condition), the per-window mean NLL [N]


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
) -> dict[str, list[dict]]:
    """``{"per_layer": rows, "per_controller": rows}`` (``per_layer_rows``), sites in order, conditions in order.

    ``counts``: the audit's bootstrap counts, so the CIs are paired with every other figure. ``group``: how
    many conditions at one site run as one batch (None: fitted to the device, ``conditions_per_pass``).
    """
    if not conditions:
        return {"per_layer": [], "per_controller": []}
    window_nll, correct = per_layer_window_nll(model, windows, cache, conditions, profiles, seed, device, group)
    return per_layer_rows(window_nll, correct, counts, model.controller_names)


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
) -> tuple[WindowNLL, torch.Tensor]:
    """Per-window mean NLL ``{(site, condition): [N]}`` and that of ``correct``, in the model's sweep mode;
    with ``shards`` (one rank's share), of those shards' windows only."""
    if sweep_mode(model) == PREFIX:
        return prefix_window_nll(model, windows, cache, conditions, profiles, seed, device, group, shards)
    return full_forward_window_nll(model, windows, cache, conditions, profiles, seed, device, shards)


def per_layer_rows(
    window_nll: WindowNLL, correct: torch.Tensor, counts: torch.Tensor, controller_names: Sequence[str]
) -> dict[str, list[dict]]:
    """The sweep's rows from the per-window NLLs of every window, ΔNLL CIs paired by ``counts``:
    ``per_layer``, ``{"layer", "controllers", "condition", "nll", "delta", "delta_ci95"}`` per decoder layer (its
    controllers' module paths), and ``per_controller``, ``{"controller", "layer", "condition", ...}`` per controller
    alone in a layer that holds more than one ([] where none does)."""
    rows: dict[str, list[dict]] = {"per_layer": [], "per_controller": []}
    for (site, condition), values in window_nll.items():
        figures = condition_figures({REFERENCE: correct, condition: values}, counts)[condition]
        if site.alone:
            where = {"controller": site.name(controller_names), "layer": site.layer}
        else:
            where = {"layer": site.layer, "controllers": [controller_names[c] for c in site.controllers]}
        kept = {key: figures[key] for key in FIGURES}
        rows["per_controller" if site.alone else "per_layer"].append({**where, "condition": condition, **kept})
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
) -> tuple[WindowNLL, torch.Tensor]:
    """Per-window mean NLL ``{(site, condition): [N]}`` and that of ``correct``, by prefix reuse.

    Batches follow the cache's shards, as in ``replay_nll``, so the arithmetic is the full forward's.
    """
    assigners = {c: ConditionCoefficients(c, cache, profiles, seed, tokens=windows) for c in conditions}
    model.eval()
    swept = sites(model.controller_layers)
    parts: dict[tuple[Site, str], list[torch.Tensor]] = {(site, c): [] for site in swept for c in conditions}
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
        for site in swept:
            for start in range(0, len(conditions), size):
                names = conditions[start : start + size]
                variants = [restrict_to(intervened[c], own, site.controllers) for c in names]
                nll = prefix.replay_nll_many(variants, site.controllers).double().mean(dim=2).cpu()
                for name, values in zip(names, nll):
                    require_finite(values, "NLL", applied_at(name, site.name(model.controller_names)), indices)
                    parts[(site, name)].append(values)
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
) -> tuple[WindowNLL, torch.Tensor]:
    """The same figures from full frozen forwards, for models without layer stepping."""

    def window_mean(condition: str, site: Site) -> torch.Tensor:
        nll = replay_nll(
            model, windows, cache, condition, profiles, seed, controllers=site.controllers, device=device, shards=shards
        )
        return nll.double().mean(dim=1)

    window_nll = {(site, c): window_mean(c, site) for site in sites(model.controller_layers) for c in conditions}
    correct = replay_nll(model, windows, cache, REFERENCE, profiles, seed, device=device, shards=shards)
    indices = torch.cat(list(cache.shard_indices(shards)))
    check_correct_replay(correct, cache.nll(indices), model.replay_tolerance, indices)
    return window_nll, correct.double().mean(dim=1)
