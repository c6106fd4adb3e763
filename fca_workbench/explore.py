"""One checkpoint opened for interactive exploration (``explore.ipynb``), with only the work its view needs.

A full audit replays every condition over every window, sweeps every layer and times the model: minutes
on a CPU. Exploring one window at a time needs far less: the eval capture (the window's own and its donor's
coefficients, and the cached live NLL), and the calibration capture only once a static profile is asked
for. Both are the audit's own captures, in the same cache folder under the same key, so an audit of the
same checkpoint and settings (``fca reproduce``, or the notebook's ``NotebookRun``) and this explorer reuse
each other's caches; ``capture`` checks their fingerprints either way.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import torch

from fca_workbench.audit.conditions import ConditionCoefficients, calibration_profiles, values_on
from fca_workbench.audit.guard import at_layer, require_finite
from fca_workbench.audit.interventions import routing_top_k
from fca_workbench.audit.run import AuditSettings, audit_windows, capture_split, load_audit_model, with_batch_size
from fca_workbench.checkpoint import checkpoint_name
from fca_workbench.errors import UserError
from fca_workbench.models import next_token_nll
from fca_workbench.results.conditions import PROFILE_CONDITIONS, model_conditions
from fca_workbench.results.tables import Column, make_table

if TYPE_CHECKING:  # pandas is imported where a table is made
    import pandas as pd


class Explorer:
    """A model, its eval windows and their coefficient cache, loaded once. Coefficients and NLLs come from
    the core (``ConditionCoefficients`` of ``replay``, the cache, ``next_token_nll``), window by window, with
    the settings' seed, exactly as the audit replays them."""

    def __init__(self, settings: AuditSettings) -> None:
        if settings.cache is None:
            raise ValueError("the explorer needs settings.cache: the folder its captures are shared in")
        self.name = checkpoint_name(settings.checkpoint)
        self.model, self.tokenizer = load_audit_model(settings)
        if not self.model.controllers:
            raise UserError(f"{self.name} has no controller ({self.model.arch}): no coefficients to explore")
        _, self.windows = audit_windows(settings, "eval", self.model, self.tokenizer)
        self.settings = with_batch_size(settings, self.model, self.windows, None)  # settings.cache is set: no out
        self.cache = capture_split(self.model, self.windows, "eval", self.settings, None)
        self.arch = self.model.arch
        self.slot_shapes = [tuple(s) for s in self.cache.manifest["slot_shapes"]]
        self.routers = [k is not None for k in routing_top_k(self.cache.values(torch.arange(1)))]
        self.conditions = model_conditions(any(self.routers))

    @property
    def num_layers(self) -> int:
        return len(self.slot_shapes)

    @functools.cached_property
    def profiles(self) -> dict[str, list[torch.Tensor]]:
        """The calibration set's static profiles, tokenized and captured when a static condition is first asked for."""
        _, windows = audit_windows(self.settings, "calibration", self.model, self.tokenizer)
        calibration = capture_split(self.model, windows, "calibration", self.settings, None)
        return calibration_profiles(calibration)

    def _assign(self, condition: str, layer: int | None):
        static = condition in PROFILE_CONDITIONS
        return ConditionCoefficients(
            condition, self.cache, self.profiles if static else None, self.settings.seed, layer
        )

    def tokens(self, window: int) -> list[str]:
        # a list of ids in, a list of tokens out
        return cast(list[str], self.tokenizer.convert_ids_to_tokens(self.windows[window].tolist()))

    def coefficients(self, condition: str, window: int, layer: int | None = None) -> list[torch.Tensor]:
        """Per layer ``[T, *slot]``: what ``condition`` (at ``layer`` only, or everywhere) assigns to ``window``."""
        if condition == "unperturbed":
            condition = "correct"
        return [c[0] for c in self._assign(condition, layer)(torch.tensor([window]))]

    @torch.no_grad()
    def token_nll(self, condition: str, window: int, layer: int | None = None) -> torch.Tensor:
        """``[T-1]`` per-token NLL of ``window`` replayed under ``condition`` (``unperturbed``: the cached live run)."""
        if condition == "unperturbed":
            return self.cache.nll(torch.tensor([window]))[0]
        parameter = next(self.model.parameters())
        batch = self.windows[[window]].to(parameter.device)
        values = values_on(
            self._assign(condition, layer).values(torch.tensor([window])), parameter.device, parameter.dtype
        )
        nll = next_token_nll(self.model.replay_run(batch, values), batch)
        require_finite(nll, "NLL", at_layer(condition, layer), [window])  # the audit's guard
        return nll[0].float().cpu()

    def window_table(self, condition: str, window: int, layer: int | None = None) -> pd.DataFrame:
        """Per-token NLL of ``window`` under ``correct`` and ``condition``, and their difference."""
        correct = self.token_nll("correct", window)
        other = self.token_nll(condition, window, layer)
        tokens = self.tokens(window)
        where = "all layers" if layer is None else f"layer {layer} only"
        columns = [
            Column("position", "position", "int"),
            Column("token", "token", "text"),
            Column("correct", "NLL correct", "float"),
            Column("nll_condition", f"NLL {condition}", "float"),
            Column("delta", "ΔNLL", "delta"),
        ]
        rows = [
            {
                "position": t + 1,
                "token": tokens[t + 1],
                "correct": float(correct[t]),
                "nll_condition": float(other[t]),
                "delta": float(other[t] - correct[t]),
            }
            for t in range(len(correct))
        ]
        return make_table(
            "explore_window",
            f"{self.name}, window {window}: per-token NLL under {condition} ({where}) against correct",
            columns,
            rows,
        )
