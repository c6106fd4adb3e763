"""The mini-audit: the audit's replay figures on a few fixed windows, cheap enough to repeat while a model trains.

It keeps the audit's core (capture, frozen replay under every condition, gap retention, variance decomposition)
on M evenly spread eval and calibration windows in a temporary cache, and drops what does not change with the
weights' values (execution counting, latency); for routers it keeps the fraction of expert evaluations run,
which the captured routing gives for free.
"""

import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from fca_workbench.adapters.loading import controlled_view
from fca_workbench.audit.capture import capture
from fca_workbench.audit.conditions import calibration_profiles, replay_conditions
from fca_workbench.audit.execution import expert_execution
from fca_workbench.audit.metrics import bootstrap_counts, condition_figures, gap_retention
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.run import RETENTION_PROFILES, coefficient_spread
from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import load_windows
from fca_workbench.errors import UserError
from fca_workbench.results.conditions import ROUTING_CONDITIONS

SPREAD_KEYS = ("r2_layer", "r2_layer_slot", "within_std", "cv")


def evenly_spread(windows: torch.Tensor, count: int, what: str) -> torch.Tensor:
    """``count`` windows spread evenly over the whole set (np.linspace), not its first plays only."""
    if count < 2:
        raise UserError(f"--audit-windows must be at least 2 (cross-input needs two windows), got {count}")
    if len(windows) < count:
        raise UserError(
            f"the {what} set gives {len(windows)} windows of {windows.shape[1]} tokens, "
            f"fewer than --audit-windows {count}"
        )
    return windows[np.linspace(0, len(windows) - 1, count).round().astype(int)]


def has_controller(model) -> bool:
    """Whether the mini-audit can audit ``model`` (a workbench model or any transformers causal LM)."""
    with controlled_view(model) as view:
        return bool(view.controllers)


class MiniAudit:
    """The replay figures of one model state on fixed eval and calibration windows.

    ``model`` is a workbench model or a transformers causal LM (seen through ``controlled_view``). Every
    condition the full audit replays is replayed, so routers add ``layer_mean_topk`` (its ΔNLL and gap
    retention) and the fraction of expert evaluations run, read from the captured routing. Calling it never
    changes the model: it runs under ``no_grad`` and puts back the train/eval mode it found.
    """

    def __init__(
        self,
        eval_windows: torch.Tensor,
        calib_windows: torch.Tensor,
        seed: int = 0,
        batch_size: int = 16,
        resamples: int = 200,
    ):
        self.eval_windows, self.calib_windows = eval_windows, calib_windows
        self.seed, self.batch_size, self.resamples = seed, batch_size, resamples

    @classmethod
    def from_splits(cls, tokenizer, window: int, count: int, eval_path=None, calib_path=None, **options):
        """M evenly spread windows of the eval and calibration texts (default: the shipped splits)."""
        chosen = {}
        for what, path in (("eval", eval_path), ("calibration", calib_path)):
            windows = load_windows(Path(path) if path else split_path(what), tokenizer, window)
            chosen[what] = evenly_spread(windows, count, what)
        return cls(chosen["eval"], chosen["calibration"], **options)

    def __call__(self, model) -> dict[str, float]:
        """The figures, in the order of ``audit_log.csv``'s columns."""
        with controlled_view(model) as view:
            if not view.controllers:
                raise UserError(
                    f"the mini-audit needs a model with a controller; {view.arch} has none the workbench can audit"
                )
            device = next(view.parameters()).device
            with tempfile.TemporaryDirectory(prefix="fca-mini-audit-") as tmp:
                options = {"batch_size": self.batch_size, "device": device}
                eval_cache = capture(view, self.eval_windows, Path(tmp) / "eval", desc="audit eval", **options)
                calib_cache = capture(view, self.calib_windows, Path(tmp) / "calib", desc="audit calib", **options)
                profiles = calibration_profiles(calib_cache)
                replayed = [c for c in replay_conditions(profiles) if c not in ("unperturbed", "correct")]
                window_nll = {
                    condition: replay_nll(
                        view, self.eval_windows, eval_cache, condition, profiles, self.seed, device=device
                    )
                    .double()
                    .mean(dim=1)
                    for condition in ("correct", *replayed)
                }
                spread = coefficient_spread(eval_cache)
                experts = expert_execution(view, eval_cache)
        counts = bootstrap_counts(len(self.eval_windows), self.resamples, self.seed)
        conditions = condition_figures(window_nll, counts)
        figures = {"nll_correct": conditions["correct"]["nll"]}
        for condition in replayed:
            c = conditions[condition]
            figures.update(
                {
                    f"delta_{condition}": c["delta"],
                    f"delta_{condition}_lo": c["delta_ci95"][0],
                    f"delta_{condition}_hi": c["delta_ci95"][1],
                }
            )
        for profile in (*RETENTION_PROFILES, *(c for c in ROUTING_CONDITIONS if c in profiles)):
            r = gap_retention(window_nll, profile, counts)
            figures.update(
                {
                    f"retention_{profile}": r["value"],
                    f"retention_{profile}_lo": r["ci95"][0],
                    f"retention_{profile}_hi": r["ci95"][1],
                }
            )
        figures.update({key: spread[key] for key in SPREAD_KEYS})
        if "expert_fraction_executed" in experts:
            figures["expert_fraction_executed"] = experts["expert_fraction_executed"]
        return {key: math.nan if value is None else float(value) for key, value in figures.items()}
