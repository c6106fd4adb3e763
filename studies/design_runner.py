"""What the design studies' runners share (``controller_design.py``, ``router_design.py``): a run's status in the
work and summary folders, the listing with the time left, the loop over the runs not done yet, and the command
line (``--work``, ``--out``, ``--shard K/N``, ``--list``, ``--table``).

A run is anything of ``DesignRun``'s shape; each runner brings its own plan, its ``run_one`` (train, audit, ...
and summarise one run) and its findings table.
"""

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from fca_workbench.foundation import flags
from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE, TRAIN_LOG_FILE, TRAIN_STATE_FILE
from fca_workbench.foundation.files import read_json, write_atomic, write_json
from fca_workbench.results.layout import AUDIT_FILE, STUDY_SUMMARY_FILE

SUMMARY_FILE = STUDY_SUMMARY_FILE  # what fca_workbench.results.design_study reads


class DesignRun(Protocol):
    """One run of a design study: a variant's seed, trained by ``fca train`` with ``train_args``."""

    @property
    def variant(self) -> str: ...

    @property
    def name(self) -> str: ...

    def train_args(self, work: Path) -> list[str]: ...


Run = TypeVar("Run", bound=DesignRun)


def status(run: DesignRun, work: Path, out: Path) -> str:
    """done / audited / trained / at step N / todo."""
    if (out / run.name / SUMMARY_FILE).is_file() and (out / run.name / TRAIN_CARD_FILE).is_file():
        return "done"
    if (work / f"{run.name}-audit" / AUDIT_FILE).is_file():
        return "audited"
    if (work / run.name / TRAIN_CARD_FILE).is_file():
        return "trained"
    log = work / run.name / TRAIN_LOG_FILE
    if (work / run.name / TRAIN_STATE_FILE).is_file() and log.is_file():
        return f"at step {len(log.read_text().splitlines()) - 1}"
    return "todo"


def seconds_taken(run: DesignRun, out: Path) -> float | None:
    """A done run's training time plus every later step's its summary records (None: an earlier invocation's)."""
    path = out / run.name / SUMMARY_FILE
    if not path.is_file():
        return None
    done = read_json(path)
    assert isinstance(done, dict)
    steps = (done.get(key) for key in ("audit_seconds", "export_seconds"))
    return float(done["train_seconds"]) + sum(float(s or 0.0) for s in steps)


def listing(runs: Sequence[DesignRun], work: Path, out: Path) -> str:
    """The plan, each run's state and time, and the time the rest would take at the measured pace."""
    lines: list[str] = []
    taken: dict[str, list[float]] = {}
    for run in runs:
        seconds = seconds_taken(run, out)
        if seconds is not None:
            taken.setdefault(run.variant, []).append(seconds)
        timing = "" if seconds is None else f"  {seconds / 60:.1f} min"
        lines.append(f"{run.name:22s} {status(run, work, out):12s}{timing}  fca {' '.join(run.train_args(work))}")
    every = [s for times in taken.values() for s in times]
    left = [r for r in runs if status(r, work, out) != "done"]
    lines.append(f"\n{len(runs) - len(left)} of {len(runs)} runs done")
    if every:
        pace = {v: statistics.fmean(t) for v, t in taken.items()}
        rest = sum(pace.get(r.variant, statistics.fmean(every)) for r in left)
        lines.append(
            f"measured {statistics.fmean(every) / 60:.1f} min per run on average; the remaining {len(left)} "
            f"would take about {rest / 3600:.1f} h at that pace (variants not yet measured counted at the average)"
        )
    return "\n".join(lines)


def keep(out: Path, name: str, checkpoint: Path, card: dict, summary: dict) -> None:
    """What a study commits of a finished run: ``out/<name>/`` with its training log, model card and summary."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / TRAIN_LOG_FILE, (checkpoint / TRAIN_LOG_FILE).read_bytes())
    write_json(folder / TRAIN_CARD_FILE, card)
    write_json(folder / SUMMARY_FILE, summary)


def study(runs: Sequence[Run], work: Path, out: Path, run_one: Callable[[Run, Path, Path], bool]) -> list[str]:
    """Every run not done yet, in order, through ``run_one``; returns the names of those fca refused."""
    failed = []
    for run in runs:
        state = status(run, work, out)
        if state == "done":
            continue
        print(f"== {run.name}: {state}", flush=True)
        if not run_one(run, work, out):
            failed.append(run.name)
    return failed


def seed_range(text: str) -> tuple[int, ...]:
    """``3-7`` (both ends included) or ``0,2,5``."""
    first, dash, last = text.partition("-")
    try:
        seeds = tuple(range(int(first), int(last) + 1)) if dash else tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds as 3-7 or 0,2,5, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative seeds, got {text!r}")
    return seeds


def study_parser(
    description: str, work: Path, out: Path, work_help: str, variants: Sequence[str], seeds: Sequence[int]
) -> argparse.ArgumentParser:
    """The command line every runner takes; a runner adds its own flags to it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--seeds",
        type=seed_range,
        default=tuple(seeds),
        help=f"seeds, as 3-7 or 0,2,5 (default {seeds[0]}-{seeds[-1]})",
    )

    def variant_list(text: str) -> tuple[str, ...]:
        unknown = sorted(set(text.split(",")) - set(variants))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown variants {', '.join(unknown)}; known: {', '.join(variants)}")
        return tuple(text.split(","))

    parser.add_argument(
        "--variants", type=variant_list, default=tuple(variants), help="comma-separated variants (default: all)"
    )
    parser.add_argument("--work", type=Path, default=work, help=work_help)
    parser.add_argument("--out", type=Path, default=out, help="the summaries")
    parser.add_argument("--list", action="store_true", help="print the plan and what is done, then stop")
    parser.add_argument("--table", action="store_true", help="print the committed summaries as Markdown, then stop")
    parser.add_argument(
        "--shard",
        type=flags.shard,
        default=flags.Shard(0, 1),
        metavar="K/N",
        help="run only every N-th run of the plan from the K-th (0-based), so N processes can share --work",
    )
    return parser


def run_study(
    args: argparse.Namespace,
    plan: Sequence[Run],
    run_one: Callable[[Run, Path, Path], bool],
    findings_table: Callable[[Path], str],
) -> None:
    """``--table``, ``--list``, or this shard's runs of ``plan`` not done yet, then the listing; exits non-zero
    naming the runs fca refused."""
    runs = args.shard.take(plan)
    if args.table:
        print(findings_table(args.out))
        return
    if not args.list:
        failed = study(runs, args.work, args.out, run_one)
        if failed:
            print(listing(runs, args.work, args.out))
            raise SystemExit(f"fca refused {len(failed)} runs: {', '.join(failed)}")
    print(listing(runs, args.work, args.out))
