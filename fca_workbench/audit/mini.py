"""The mini-audit: the audit's replay figures on a few fixed windows, cheap enough to repeat while a model trains.

It runs ``run_audit``'s own steps (capture, calibration profiles, frozen replay under every condition, replay
and spread figures) on M evenly spread eval and calibration windows (``data.windows.even_sample``, as
``--max-windows`` picks them) in a temporary cache, so it reports only figures ``audit.json`` has, equal to an
audit's on the same windows. It drops what does not change with the weights' values (execution counting,
latency); for routers it keeps the fraction of expert evaluations run, which the captured routing gives for free.
"""

import math
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.controlled import controlled_view
from fca_workbench.audit.execution import expert_execution
from fca_workbench.audit.inputs import CALIBRATION, EVAL
from fca_workbench.audit.metrics import bootstrap_counts
from fca_workbench.audit.session import ReplaySession
from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import even_sample, load_windows
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import BASELINES, REFERENCE

SPREAD_KEYS = ("r2_layer", "r2_layer_slot", "within_std", "cv")


def has_controller(model: nn.Module) -> bool:
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
    ) -> None:
        self.eval_windows, self.calib_windows = eval_windows, calib_windows
        self.seed, self.batch_size, self.resamples = seed, batch_size, resamples

    @classmethod
    def from_splits(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        window: int,
        count: int,
        eval_path: str | Path | None = None,
        calib_path: str | Path | None = None,
        **options: int,
    ) -> "MiniAudit":
        """M evenly spread windows of the eval and calibration texts (default: the shipped splits)."""
        if count < 2:
            raise UserError(f"--audit-windows must be at least 2 (cross-input needs two windows), got {count}")
        chosen = {}
        for what, path in (("eval", eval_path), ("calibration", calib_path)):
            windows = load_windows(Path(path) if path else split_path(what), tokenizer, window)
            if len(windows) < count:
                raise UserError(
                    f"the {what} set gives {len(windows)} windows of {window} tokens, fewer than --audit-windows {count}"
                )
            chosen[what] = windows[even_sample(len(windows), count)]
        return cls(chosen["eval"], chosen["calibration"], **options)

    def __call__(self, model: nn.Module) -> dict[str, float]:
        """The figures, in the order of ``audit_log.csv``'s columns: ``run_audit``'s own steps (capture,
        profiles, replay of every condition, replay and spread figures, expert execution) on these windows."""
        with controlled_view(model) as view:
            if not view.controllers:
                raise UserError(
                    f"the mini-audit needs a model with a controller; {view.arch} has none the workbench can audit"
                )
            device = next(view.parameters()).device
            with tempfile.TemporaryDirectory(prefix="fca-mini-audit-") as tmp:
                splits = {EVAL: lambda: (None, self.eval_windows), CALIBRATION: lambda: (None, self.calib_windows)}
                session = ReplaySession(
                    view, splits, cache_root=Path(tmp), seed=self.seed, device=device, batch_size=self.batch_size
                )
                session.capture_all()
                per_token = session.replay(session.conditions)
                spread = session.spread()
                experts = expert_execution(view, session.eval_cache)
                counts = bootstrap_counts(len(self.eval_windows), self.resamples, self.seed)
                figures = session.figures(per_token, counts)
        return log_row({**figures, **spread, "execution": experts})


def log_row(audit: dict) -> dict[str, float]:
    """The mini-audit's columns of ``audit_log.csv`` from its audit figures (``audit.json``'s names, flat):
    the correct NLL, every intervention's ΔNLL with its CI, every retention with its CI, the spread figures
    and, for routers, the fraction of expert evaluations run."""
    conditions = audit["conditions"]
    figures = {f"nll_{REFERENCE}": conditions[REFERENCE]["nll"]}
    for condition in (c for c in conditions if c not in BASELINES):  # every other condition intervenes
        c = conditions[condition]
        figures.update(
            {
                f"delta_{condition}": c["delta"],
                f"delta_{condition}_lo": c["delta_ci95"][0],
                f"delta_{condition}_hi": c["delta_ci95"][1],
            }
        )
    for profile, r in audit["retention"].items():
        figures.update(
            {
                f"retention_{profile}": r["value"],
                f"retention_{profile}_lo": r["ci95"][0],
                f"retention_{profile}_hi": r["ci95"][1],
            }
        )
    spread = {**audit["variance"], **audit["variation"]}
    figures.update({key: spread[key] for key in SPREAD_KEYS})
    if "expert_fraction_executed" in audit["execution"]:
        figures["expert_fraction_executed"] = audit["execution"]["expert_fraction_executed"]
    return {key: math.nan if value is None else float(value) for key, value in figures.items()}
