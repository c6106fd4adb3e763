"""Speed and memory of the audit, as ratios measured in one run (absolute times are noise here).

    .venv/bin/python benchmarks/bench_audit.py [--checkpoint data/checkpoints/featuregate-s0] [--windows 256]

Writes benchmarks/results/bench_audit.json and .md:
- capture time / plain forward time on the same windows (goal <= 1.10);
- replay time per condition / plain forward time (goal <= 1.0: the controller is skipped);

each step timed as the replay session users run does it (``ReplaySession``: ``cache("eval")``, ``nll``), the
model fingerprint taken at ``open`` from the memo, as for every audit of a checkpoint after its first;
- full audit (all conditions) / (number of conditions x plain forward) (goal <= 1.15);
- peak memory (RSS) of capture at 100 vs 1,000 windows, each in a fresh process (goal: ratio <= 1.2).
"""

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from bench_session import handed_in
from results_file import write_results
from timing import timed

from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.models import load_model

WINDOW = 256


@torch.no_grad()
def plain_forward(model, windows, batch_size):
    for batch in windows.split(batch_size):
        model(batch)


def peak_rss_of_capture(checkpoint: str, windows: int, batch_size: int) -> dict:
    """Run a capture of ``windows`` random windows in a fresh process; its RSS before and at peak (MiB)."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--checkpoint",
            checkpoint,
            "--memory-probe",
            str(windows),
            "--batch-size",
            str(batch_size),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_probe(checkpoint: str, windows: int, batch_size: int) -> None:
    model = load_model(checkpoint)
    ids = torch.randint(0, model.config.vocab_size, (windows, WINDOW), generator=torch.Generator().manual_seed(0))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as tmp:
        handed_in(model, ids, cache_root=Path(tmp), batch_size=batch_size).cache(EVAL)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"windows": windows, "rss_before_mib": before, "rss_peak_mib": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/featuregate-s0")
    parser.add_argument("--windows", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--memory-probe", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    if args.memory_probe:
        return memory_probe(args.checkpoint, args.memory_probe, args.batch_size)

    settings = AuditSettings(
        checkpoint=args.checkpoint, window=WINDOW, max_windows=args.windows, batch_size=args.batch_size
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        session = ReplaySession.open(settings, tmp / "session")
        model, windows = session.model, session.windows(EVAL)
        plain_forward(model, windows[: args.batch_size], args.batch_size)  # warm-up
        forward = timed(lambda: plain_forward(model, windows, args.batch_size))
        capture_seconds = timed(lambda: session.cache(EVAL))
        session.profiles  # noqa: B018 (the calibration capture, before the replays are timed)
        replay = {condition: timed(functools.partial(session.nll, condition)) for condition in session.conditions}
        audit_seconds = timed(lambda: run_audit(settings, tmp / "audit"))
    memory = [peak_rss_of_capture(args.checkpoint, n, args.batch_size) for n in (100, 1000)]
    results = {
        "checkpoint": args.checkpoint,
        "windows": args.windows,
        "window": WINDOW,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "plain_forward_seconds": forward,
        "capture_over_forward": capture_seconds / forward,
        "replay_over_forward": {c: t / forward for c, t in replay.items()},
        "full_audit_over_conditions_x_forward": audit_seconds / (len(replay) * forward),
        "capture_peak_rss_mib": {str(m["windows"]): m["rss_peak_mib"] for m in memory},
        "capture_peak_rss_ratio_1000_vs_100": memory[1]["rss_peak_mib"] / memory[0]["rss_peak_mib"],
    }
    write_results("bench_audit", results, markdown(results))


def markdown(r: dict) -> str:
    lines = [
        f"# Audit benchmark ({r['checkpoint']}, {r['windows']} windows x {r['window']}, batch {r['batch_size']}, "
        f"{r['threads']} threads)",
        "",
        "| ratio | measured | goal |",
        "|---|---|---|",
        f"| capture / plain forward | {r['capture_over_forward']:.3f} | <= 1.10 |",
    ]
    lines += [f"| replay `{c}` / plain forward | {v:.3f} | <= 1.0 |" for c, v in r["replay_over_forward"].items()]
    lines += [
        f"| full audit / ({len(r['replay_over_forward'])} conditions x plain forward) | "
        f"{r['full_audit_over_conditions_x_forward']:.3f} | <= 1.15 |",
        f"| capture peak RSS, 1000 vs 100 windows | {r['capture_peak_rss_ratio_1000_vs_100']:.3f} "
        f"({r['capture_peak_rss_mib']['1000']:.0f} / {r['capture_peak_rss_mib']['100']:.0f} MiB) | <= 1.2 |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
