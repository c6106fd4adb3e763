"""Mini-audit while a model trains: the audit's replay figures on a few fixed windows, every N steps.

A full ``fca audit`` is too slow to repeat during training; this keeps its core (capture, frozen replay under
every condition, gap retention, variance decomposition) on M evenly spread eval and calibration windows, in a
temporary cache, and drops what does not change with the weights' values (execution counting, latency); for
routers it keeps the fraction of expert evaluations run, which the captured routing gives for free.
``fca train --audit-every N`` and ``fca_workbench.callbacks.FCACallback`` both call ``MiniAudit``, so a row of
``audit_log.csv`` and a Trainer log entry hold the same figures as a standalone ``MiniAudit`` of the weights.
"""

import csv
import io
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .adapters import controlled_view
from .audit import RETENTION_PROFILES, coefficient_spread
from .capture import capture
from .data import load_windows, split_path, write_atomic
from .errors import UserError
from .execution import expert_execution
from .interventions import ROUTING_CONDITIONS
from .metrics import bootstrap_counts, condition_figures, gap_retention
from .replay import calibration_profiles, replay_conditions, replay_nll
from .resources import shipped

AUDIT_LOG = "audit_log.csv"
SPREAD_KEYS = ("r2_layer", "r2_layer_slot", "within_std", "cv")


def evenly_spread(windows: torch.Tensor, count: int, what: str) -> torch.Tensor:
    """``count`` windows spread evenly over the whole set (np.linspace), not its first plays only."""
    if count < 2:
        raise UserError(f"--audit-windows must be at least 2 (cross-input needs two windows), got {count}")
    if len(windows) < count:
        raise UserError(f"the {what} set gives {len(windows)} windows of {windows.shape[1]} tokens, "
                        f"fewer than --audit-windows {count}")
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

    def __init__(self, eval_windows: torch.Tensor, calib_windows: torch.Tensor, seed: int = 0,
                 batch_size: int = 16, resamples: int = 200):
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
                raise UserError(f"the mini-audit needs a model with a controller; {view.arch} has none the workbench "
                                "can audit")
            device = next(view.parameters()).device
            with tempfile.TemporaryDirectory(prefix="fca-mini-audit-") as tmp:
                options = {"batch_size": self.batch_size, "device": device}
                eval_cache = capture(view, self.eval_windows, Path(tmp) / "eval", desc="audit eval", **options)
                calib_cache = capture(view, self.calib_windows, Path(tmp) / "calib", desc="audit calib", **options)
                profiles = calibration_profiles(calib_cache)
                replayed = [c for c in replay_conditions(profiles) if c not in ("unperturbed", "correct")]
                window_nll = {
                    condition: replay_nll(view, self.eval_windows, eval_cache, condition, profiles, self.seed,
                                          device=device).double().mean(dim=1)
                    for condition in ("correct", *replayed)
                }
                spread = coefficient_spread(eval_cache)
                experts = expert_execution(view, eval_cache)
        counts = bootstrap_counts(len(self.eval_windows), self.resamples, self.seed)
        conditions = condition_figures(window_nll, counts)
        figures = {"nll_correct": conditions["correct"]["nll"]}
        for condition in replayed:
            c = conditions[condition]
            figures.update({f"delta_{condition}": c["delta"], f"delta_{condition}_lo": c["delta_ci95"][0],
                            f"delta_{condition}_hi": c["delta_ci95"][1]})
        for profile in (*RETENTION_PROFILES, *(c for c in ROUTING_CONDITIONS if c in profiles)):
            r = gap_retention(window_nll, profile, counts)
            figures.update({f"retention_{profile}": r["value"], f"retention_{profile}_lo": r["ci95"][0],
                            f"retention_{profile}_hi": r["ci95"][1]})
        figures.update({key: spread[key] for key in SPREAD_KEYS})
        if "expert_fraction_executed" in experts:
            figures["expert_fraction_executed"] = experts["expert_fraction_executed"]
        return {key: math.nan if value is None else float(value) for key, value in figures.items()}


class AuditLog:
    """``audit_log.csv`` of a training run: one row per audited step, rewritten atomically at each audit.

    Rows past the step a run resumes from are dropped, so a resumed run recomputes them and never repeats one.
    Columns: ``step``, ``audit_seconds``, then the mini-audit's figures in its order (routers add theirs).
    """

    def __init__(self, folder, resume_step: int):
        self.path = Path(folder) / AUDIT_LOG
        self.rows = []
        if self.path.is_file():
            with self.path.open() as handle:
                self.rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= resume_step]

    def append(self, step: int, audit_seconds: float, figures: dict[str, float]) -> dict:
        row = {"step": step, "audit_seconds": round(audit_seconds, 3), **figures}
        self.rows.append(row)
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(row), lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(self.path, buffer.getvalue().encode())
        return row

    def audit_seconds(self) -> float:
        return sum(float(row["audit_seconds"]) for row in self.rows)


class TrainingAudit:
    """``fca train --audit-every N``: the mini-audit every N steps and at the end, logged to ``audit_log.csv``."""

    def __init__(self, audit: MiniAudit, every: int, last_step: int, log: AuditLog):
        self.audit, self.every, self.last_step, self.log = audit, every, last_step, log

    @classmethod
    def for_run(cls, settings, model, tokenizer, folder, resume_step: int):
        """None without ``audit_every``; every bad setting is a one-line UserError before training starts."""
        if settings.audit_every is None:
            return None
        if not has_controller(model):
            raise UserError(f"--audit-every needs a model with a controller; {settings.name} has none the "
                            "workbench can audit")
        if not 1 <= settings.audit_every <= settings.steps:
            raise UserError(f"--audit-every {settings.audit_every} must be between 1 and the run's "
                            f"{settings.steps} steps")
        audit = MiniAudit.from_splits(tokenizer, settings.window, settings.audit_windows, seed=settings.seed,
                                      batch_size=settings.batch_size)
        return cls(audit, settings.audit_every, settings.steps, AuditLog(folder, resume_step))

    def maybe_run(self, model, step: int) -> dict | None:
        """Audit at multiples of N and at the run's last step; returns the new row, or None."""
        if step % self.every and step != self.last_step:
            return None
        started = time.perf_counter()
        figures = self.audit(model)
        return self.log.append(step, time.perf_counter() - started, figures)

    def card(self, train_seconds: float) -> dict:
        """The audits' cost, as a fraction of the training time spent outside them."""
        spent = self.log.audit_seconds()
        return {"every": self.every, "windows": len(self.audit.eval_windows), "audits": len(self.log.rows),
                "audit_seconds": round(spent, 1), "fraction_of_training": round(spent / max(train_seconds - spent, 1e-9), 4)}


def postfix(row: dict) -> dict:
    """What the progress bar shows of the latest audit."""
    return {"retention": f"{float(row['retention_layer_mean']):.3f}",
            "dNLL_cross": f"{float(row['delta_cross_input']):+.3f}"}


TRAINING_DYNAMICS_DIR = shipped("data") / "training_dynamics"  # the shipped study, in a checkout or a wheel


def load_training_run(folder) -> dict:
    """A training run's logs as DataFrames: ``audit`` (``audit_log.csv``), ``train`` (``train_log.csv``) and its
    model card (None while the run is unfinished: the logs are then partial)."""
    import json

    import pandas as pd

    folder = Path(folder)
    if not (folder / AUDIT_LOG).is_file():
        raise UserError(f"{folder} has no {AUDIT_LOG}: train it with fca train --audit-every N")
    card = folder / "model_card.json"
    return {
        "name": folder.name,
        "audit": pd.read_csv(folder / AUDIT_LOG),
        "train": pd.read_csv(folder / "train_log.csv") if (folder / "train_log.csv").is_file() else None,
        "card": json.loads(card.read_text()) if card.is_file() else None,
    }


def load_training_runs(folders=None) -> list[dict]:
    """Several runs (default: the shipped ``data/training_dynamics/*``), in folder-name order."""
    folders = folders or sorted(p for p in TRAINING_DYNAMICS_DIR.iterdir() if (p / AUDIT_LOG).is_file())
    return [load_training_run(f) for f in ([folders] if isinstance(folders, (str, Path)) else folders)]
