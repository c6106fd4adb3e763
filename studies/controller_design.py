"""The controller-design study (issue 27): which FeatureGate design choices make the gates static?

    OMP_NUM_THREADS=1 python studies/controller_design.py [--work /tmp/controller_design]
        [--out data/controller_design] [--shard K/N] [--list | --table]

Every variant is ``fca train --arch featuregate --seed S --steps 300`` plus its flags (``VARIANTS``: the
default, each design option's non-default values one at a time, width 256 × 6 layers, and one combination),
followed by ``fca audit`` of the finished checkpoint with the default settings (the whole eval split). Both
run through ``fca_workbench.cli.main``, so each run is exactly the command its summary records. Runs go seed 0
of every variant first, then seeds 1 and 2.

Weights, optimizer state and audit folders stay in ``--work`` (outside the repository); ``--out/<run>/`` gets
``train_log.csv``, ``model_card.json`` and ``audit_summary.json`` (the audit's figures: every condition's NLL
and ΔNLL with 95% CIs, gap retention, R² of layer and layer×slot, variation, verdicts). A run whose summary
is written is done and skipped; a run interrupted in training resumes from its last checkpoint (every 100
steps), one trained but not audited is audited. ``--list`` prints the plan, what is done, and the time taken;
``--table`` prints the committed summaries as the Markdown table docs/controller-design.md quotes. The status,
listing, loop and command line are ``design_runner``'s, shared with the router-design study.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # design_runner, beside this script

from design_runner import keep, run_study, study_parser

from fca_workbench.cli import main as fca
from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE
from fca_workbench.foundation.files import read_json
from fca_workbench.results.design_study import design_seed_table, read_design_study
from fca_workbench.results.layout import AUDIT_FILE
from fca_workbench.results.tabular import to_markdown

ROOT = Path(__file__).resolve().parent.parent
STEPS = 300
SEEDS = (0, 1, 2)

# name -> the flags it adds to ``fca train --arch featuregate``; the default model's weight decay is 0.1
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "range-sigmoid": ("--gate-range", "sigmoid"),
    "range-1tanh": ("--gate-range", "1+tanh"),
    "input-raw": ("--gate-input", "raw"),
    "input-detached": ("--gate-input", "detached"),
    "groups-1": ("--gate-groups", "1"),
    "groups-96": ("--gate-groups", "96"),  # one gate per channel at the default width
    "cwd-0": ("--controller-weight-decay", "0"),
    "cwd-1": ("--controller-weight-decay", "1.0"),  # 10x the model's
    "clr-0.1": ("--controller-lr-mult", "0.1"),
    "clr-10": ("--controller-lr-mult", "10"),
    # the combination expected to be most static: one gate per branch, no gradient through the hidden state,
    # and a controller matrix decayed hard toward zero, so the (undecayed) bias carries a per-layer constant
    "combo": ("--gate-groups", "1", "--gate-input", "detached", "--controller-weight-decay", "1.0"),
    "wide-256x6": ("--width", "256", "--layers", "6"),  # ~5M parameters: a first look at scale
}


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int
    steps: int = STEPS
    train_extra: tuple[str, ...] = ()  # flags the study does not vary (tests shrink the model with them)
    audit_extra: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"

    def train_args(self, work: Path) -> list[str]:
        flags = ["--seed", str(self.seed), "--steps", str(self.steps), *self.train_extra, *VARIANTS[self.variant]]
        return ["train", "--arch", "featuregate", *flags, "--out", str(work / self.name)]

    def audit_args(self, work: Path) -> list[str]:
        return ["audit", str(work / self.name), *self.audit_extra, "--out", str(work / f"{self.name}-audit")]


def plan(
    seeds: Sequence[int] = SEEDS, variants: Sequence[str] = tuple(VARIANTS), steps: int = STEPS, **extra: tuple
) -> list[Run]:
    """Seed 0 of every variant first, then the next seed: a partial study still covers every axis."""
    return [Run(v, s, steps, **extra) for s in seeds for v in variants]


def summary(run: Run, card: dict, audit: dict, audit_seconds: float | None) -> dict:
    """What the study keeps of one run: its commands, cost, eval NLL and the audit's figures as audit.json has
    them (so ``results.seeds.summarise`` and the audit tables read a list of summaries as they read audits).
    ``audit_seconds`` is None when an earlier invocation ran the audit."""
    return {
        "run": run.name,
        "variant": run.variant,
        "seed": run.seed,
        "commands": {
            "train": "fca " + " ".join(run.train_args(Path("WORK"))),
            "audit": "fca " + " ".join(run.audit_args(Path("WORK"))),
        },
        "train_seconds": card["train_seconds"],
        "audit_seconds": None if audit_seconds is None else round(audit_seconds, 1),
        "eval_nll": card["eval_nll"],
        "params": card["params"],
        "model": {k: v for k, v in audit["model"].items() if k != "path"},
        "data": audit["data"],
        "settings": {k: v for k, v in audit["settings"].items() if k not in ("checkpoint", "cache")},
        **{k: audit[k] for k in ("conditions", "retention", "variance", "variation", "execution", "verdict")},
    }


def run_one(run: Run, work: Path, out: Path) -> bool:
    """Train (or resume), audit and summarise one run; False when fca refused a step (its message is printed)."""
    checkpoint, audit_dir = work / run.name, work / f"{run.name}-audit"
    if not (checkpoint / TRAIN_CARD_FILE).is_file() and fca(run.train_args(work)) != 0:
        return False
    audit_seconds = None
    if not (audit_dir / AUDIT_FILE).is_file():
        started = time.perf_counter()
        if fca(run.audit_args(work)) != 0:
            return False
        audit_seconds = time.perf_counter() - started
    card = read_json(checkpoint / TRAIN_CARD_FILE)
    audit = read_json(audit_dir / AUDIT_FILE)
    assert isinstance(card, dict) and isinstance(audit, dict)  # read_json's default expect
    keep(out, run.name, checkpoint, card, summary(run, card, audit, audit_seconds))
    return True


def findings_table(out: Path) -> str:
    """Every variant's figures as mean ± sd over its seeds (the one seed-aggregation path, results/seeds.py), in
    the Markdown every table of the workbench is written in."""
    study = read_design_study(out)
    skipped = [f"left out: {line}" for line in study.skipped]
    return "\n".join([to_markdown(design_seed_table(study.runs)), *skipped])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    work = Path("/tmp/controller_design")
    return study_parser(
        __doc__.splitlines()[0], work, ROOT / "data" / "controller_design", "weights and audits", tuple(VARIANTS), SEEDS
    ).parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    run_study(args, plan(args.seeds, args.variants), run_one, findings_table)
