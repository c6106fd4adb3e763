"""Mini-audit while a model trains: the audit's replay figures on a few fixed windows, every N steps.

A full ``fca audit`` is too slow to repeat during training; this keeps its core (capture, frozen replay under
every condition, gap retention, variance decomposition) on M evenly spread eval and calibration windows, in a
temporary cache, and drops what does not change with the weights' values (execution counting, latency); for
routers it keeps the fraction of expert evaluations run, which the captured routing gives for free.
``fca train --audit-every N`` and ``fca_workbench.training.callbacks.FCACallback`` both call ``MiniAudit``, so a row of
``audit_log.csv`` and a Trainer log entry hold the same figures as a standalone ``MiniAudit`` of the weights.
"""

import csv
import io
import time
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase

from fca_workbench.audit.mini import MiniAudit, has_controller
from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE, TRAIN_LOG_FILE
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, reading, write_atomic
from fca_workbench.foundation.resources import shipped
from fca_workbench.training.train_settings import TrainSettings

AUDIT_LOG = "audit_log.csv"


class AuditLog:
    """``audit_log.csv`` of a training run: one row per audited step, rewritten atomically at each audit.

    Rows past the step a run resumes from are dropped, so a resumed run recomputes them and never repeats one.
    Columns: ``step``, ``audit_seconds``, then the mini-audit's figures in its order (routers add theirs).
    """

    def __init__(self, folder: str | Path, resume_step: int) -> None:
        self.path = Path(folder) / AUDIT_LOG
        self.rows: list[dict] = []
        if self.path.exists():
            with reading(f"{self.path} is not a log fca train wrote", "remove it or choose another --out"):
                with self.path.open(encoding="utf-8", newline="") as handle:
                    rows = list(csv.DictReader(handle))
                if any(None in row or None in row.values() for row in rows):  # fields beyond the header, or short
                    raise ValueError("a row's fields do not match its header")
                self.rows = [row for row in rows if int(row["step"]) <= resume_step]

    def append(self, step: int, audit_seconds: float, figures: dict[str, float]) -> dict:
        row = {"step": step, "audit_seconds": round(audit_seconds, 3), **figures}
        if self.rows and not set(self.rows[0]) <= set(row):  # columns this run's audits do not have
            raise UserError(
                f"{self.path} holds other columns than this run's audits; remove it or choose another --out"
            )
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

    def __init__(self, audit: MiniAudit, every: int, last_step: int, log: AuditLog) -> None:
        self.audit, self.every, self.last_step, self.log = audit, every, last_step, log

    @classmethod
    def for_run(
        cls,
        settings: TrainSettings,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        folder: str | Path,
        resume_step: int,
    ) -> "TrainingAudit | None":
        """None without ``audit_every``; every bad setting is a one-line UserError before training starts."""
        if settings.audit_every is None:
            return None
        if not has_controller(model):
            raise UserError(
                f"--audit-every needs a model with a controller; {settings.name} has none the workbench can audit"
            )
        if not 1 <= settings.audit_every <= settings.steps:
            raise UserError(
                f"--audit-every {settings.audit_every} must be between 1 and the run's {settings.steps} steps"
            )
        audit = MiniAudit.from_splits(
            tokenizer, settings.window, settings.audit_windows, seed=settings.seed, batch_size=settings.batch_size
        )
        return cls(audit, settings.audit_every, settings.steps, AuditLog(folder, resume_step))

    def maybe_run(self, model: nn.Module, step: int) -> dict | None:
        """Audit at multiples of N and at the run's last step; returns the new row, or None."""
        if step % self.every and step != self.last_step:
            return None
        started = time.perf_counter()
        figures = self.audit(model)
        return self.log.append(step, time.perf_counter() - started, figures)

    def card(self, train_seconds: float) -> dict:
        """The audits' cost, as a fraction of the training time spent outside them."""
        spent = self.log.audit_seconds()
        return {
            "every": self.every,
            "windows": len(self.audit.eval_windows),
            "audits": len(self.log.rows),
            "audit_seconds": round(spent, 1),
            "fraction_of_training": round(spent / max(train_seconds - spent, 1e-9), 4),
        }


def postfix(row: dict) -> dict:
    """What the progress bar shows of the latest audit."""
    return {
        "retention": f"{float(row['retention_layer_mean']):.3f}",
        "dNLL_cross": f"{float(row['delta_cross_input']):+.3f}",
    }


TRAINING_DYNAMICS_DIR = shipped("data") / "training_dynamics"  # the shipped study, in a checkout or a wheel


def load_training_run(folder: str | Path) -> dict:
    """A training run's logs as DataFrames: ``audit`` (``audit_log.csv``), ``train`` (``train_log.csv``) and its
    model card (None while the run is unfinished: the logs are then partial)."""
    import pandas as pd

    folder = Path(folder)
    if not (folder / AUDIT_LOG).is_file():
        raise UserError(f"{folder} has no {AUDIT_LOG}: train it with fca train --audit-every N")
    card, train_log = folder / TRAIN_CARD_FILE, folder / TRAIN_LOG_FILE
    with reading(f"unreadable training log in {folder}"):  # pandas' parser errors, a file that is not UTF-8
        audit = pd.read_csv(folder / AUDIT_LOG)
        train = pd.read_csv(train_log) if train_log.is_file() else None
    return {
        "name": folder.name,
        "audit": audit,
        "train": train,
        "card": read_json(card) if card.exists() else None,
    }


def load_training_runs(folders: str | Path | list | None = None) -> list[dict]:
    """Several runs (default: the shipped ``data/training_dynamics/*``), in folder-name order."""
    folders = folders or sorted(p for p in TRAINING_DYNAMICS_DIR.iterdir() if (p / AUDIT_LOG).is_file())
    return [load_training_run(f) for f in ([folders] if isinstance(folders, (str, Path)) else folders)]
