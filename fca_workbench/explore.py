"""One checkpoint opened for interactive exploration (the explorer notebook, ``notebooks/explore.py``), with only
the work its view needs.

A full audit replays every condition over every window, sweeps every layer and times the model: minutes
on a CPU. Exploring one window at a time needs far less: the eval capture (the window's own and its donor's
coefficients, and the cached live NLL), and the calibration capture only once a static profile is asked
for. Both are the audit's own captures, in the same cache folder under the same key, so an audit of the
same checkpoint and settings (``fca reproduce``, or the notebook's ``NotebookRun``) and this explorer reuse
each other's caches; ``capture`` checks their fingerprints either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fca_workbench.adapters.sites import Choice, choice_name, chosen_controllers, controller_labels, site_choices
from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.data.tokenizer import decode_tokens
from fca_workbench.foundation.checkpoint import checkpoint_name
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import REFERENCE
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # pandas is imported where a table is made
    import pandas as pd


class Explorer:
    """A replay session on one checkpoint, its eval windows and their coefficient cache, opened once:
    coefficients and NLLs window by window, with the settings' seed, exactly as the audit replays them."""

    def __init__(self, settings: AuditSettings) -> None:
        if settings.cache is None:
            raise ValueError("the explorer needs settings.cache: the folder its captures are shared in")
        self.name = checkpoint_name(settings.checkpoint)
        self.session = ReplaySession.open(settings, read_now=(EVAL,))
        self.model, self.tokenizer, self.windows = self.session.model, self.session.tokenizer, self.session.windows()
        if not self.model.controllers:
            raise UserError(f"{self.name} has no controller ({self.model.arch}): no coefficients to explore")
        self.settings = self.session.fitted_settings
        self.cache = self.session.eval_cache
        self.arch = self.model.arch
        self.slot_shapes = [tuple(s) for s in self.cache.manifest["slot_shapes"]]
        self.routers = [k is not None for k in self.session.router_top_k]
        self.conditions = self.session.conditions

    @property
    def choices(self) -> dict[str, int | str]:
        """Where a condition can be applied alone: each decoder layer, and each controller alone in a layer that
        holds several (``adapters.sites``)."""
        return site_choices(self.model.controller_names, self.model.controller_layers)

    @property
    def controller_labels(self) -> list[str]:
        """Per controller, its name on a figure's axis: ``layer L``, or its module path in a layer of several."""
        return controller_labels(self.model.controller_names, self.model.controller_layers)

    def controllers_at(self, at: Choice) -> list[int] | None:
        """The controller indices ``at`` (a decoder layer, a controller's module path; None: every one) names."""
        try:
            return chosen_controllers(at, self.model.controller_names, self.model.controller_layers)
        except ValueError as error:
            raise UserError(str(error)) from None

    @property
    def profiles(self) -> dict[str, list[torch.Tensor]]:
        """The calibration set's static profiles, captured when a static condition is first asked for."""
        return self.session.profiles

    def tokens(self, window: int) -> list[str]:
        return decode_tokens(self.tokenizer, self.windows[window].tolist())

    def coefficients(self, condition: str, window: int, at: Choice = None) -> list[torch.Tensor]:
        """Per controller ``[T, *slot]``: what ``condition`` (at ``at`` only: a decoder layer or a controller's module
        path; None: everywhere) assigns to ``window``."""
        named, controllers = self.session.check_condition(condition), self.controllers_at(at)
        return [c[0] for c in self.session.coefficients(named, torch.tensor([window]), controllers)]

    def token_nll(self, condition: str, window: int, at: Choice = None) -> torch.Tensor:
        """``[T-1]`` per-token NLL of ``window`` replayed under ``condition`` (the live run: its cached NLL)."""
        named, controllers = self.session.check_condition(condition), self.controllers_at(at)
        nll = self.session.window_nll(named, torch.tensor([window]), controllers)
        return nll[0].float().cpu()

    def window_table(self, condition: str, window: int, at: Choice = None) -> pd.DataFrame:
        """Per-token NLL of ``window`` under ``correct`` and ``condition``, and their difference."""
        correct = self.token_nll(REFERENCE, window)
        other = self.token_nll(condition, window, at)
        tokens = self.tokens(window)
        where = "all layers" if at is None else f"{choice_name(at)} only"
        columns = [
            Column("position", "position", "int"),
            Column("token", "token", "text"),
            Column(REFERENCE, f"NLL {REFERENCE}", "float"),
            Column("nll_condition", f"NLL {condition}", "float"),
            Column("delta", "ΔNLL", "delta"),
        ]
        rows = [
            {
                "position": t + 1,
                "token": tokens[t + 1],
                REFERENCE: float(correct[t]),
                "nll_condition": float(other[t]),
                "delta": float(other[t] - correct[t]),
            }
            for t in range(len(correct))
        ]
        return make_table(
            "explore_window",
            f"{self.name}, window {window}: per-token NLL under {condition} ({where}) against {REFERENCE}",
            columns,
            rows,
        )
