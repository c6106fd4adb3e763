"""Capture and replay cost of the shipped MoE against its plain forward, and its latency against the static
mixture, as ratios measured in one run with every operation interleaved (absolute times are noise here).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_moe.py [--checkpoint data/checkpoints/moe-s0]
        [--batch-size 16] [--repeats 15]

Each round times, in turn and on the same batch of eval windows: the plain forward (routers live), the capture
forward (``capture_run``: the routers' whole outputs recorded), the frozen replays of ``correct`` and
``cross_input`` (cached router outputs, no router runs), of ``layer_mean`` (a static mixture: every expert
weighted by its calibration mean gate) and ``layer_mean_topk`` (each layer's top-k experts by mean gate), and
the latency baseline of the execution audit (the static mixture with a uniform gate, every expert for every
token). Each replay is the replay session's (``ReplaySession.window_nll``, as users run it: the cached values
read and placed, the frozen forward and its NLL). The ratio of each to the plain forward of the same round is
taken, then the median over rounds. Also: the session's on-disk capture of all the windows
(``ReplaySession.cache``, safetensors shards) against plain forwards of the same windows, alternated.

Writes benchmarks/results/bench_moe.json and .md.
"""

import argparse
import functools
import statistics
import tempfile
from pathlib import Path

import torch
from bench_session import handed_in
from results_file import write_results
from timing import timed

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.inputs import EVAL
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows

WINDOW = 256


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/moe-s0")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calibration-windows", type=int, default=32)
    parser.add_argument("--capture-windows", type=int, default=64)
    args = parser.parse_args()

    model = load_controlled(args.checkpoint)
    tokenizer = load_tokenizer(args.checkpoint)
    windows = load_windows(split_path("eval"), tokenizer, WINDOW, max(args.capture_windows, args.batch_size))
    calibration = load_windows(split_path("calibration"), tokenizer, WINDOW, args.calibration_windows)
    indices = torch.arange(args.batch_size)
    batch = windows[indices]
    with tempfile.TemporaryDirectory() as tmp:
        session = handed_in(model, windows, calibration, Path(tmp), args.batch_size)
        session.cache(EVAL)
        session.profiles  # noqa: B018 (captured and estimated before anything is timed)
        top_k = session.router_top_k
        baseline_name, baseline = model.latency_baseline()
        operations = {
            "plain forward": lambda: model(batch),
            "capture (capture_run)": lambda: model.capture_run(batch),
            "replay correct": lambda: session.window_nll("correct", indices),
            "replay cross_input": lambda: session.window_nll("cross_input", indices),
            "replay layer_mean (static mixture of the profile)": lambda: session.window_nll("layer_mean", indices),
            "replay layer_mean_topk": lambda: session.window_nll("layer_mean_topk", indices),
            f"{baseline_name} (execution baseline: every expert for every token)": lambda: baseline(batch),
        }
        for operation in operations.values():  # warm-up
            operation()
        seconds: dict[str, list[float]] = {name: [] for name in operations}
        for _ in range(args.repeats):
            for name, operation in operations.items():
                seconds[name].append(timed(operation))
    forward = seconds["plain forward"]
    ratios = {name: statistics.median(t / f for t, f in zip(times, forward)) for name, times in seconds.items()}

    disk, plain = [], []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            fresh = handed_in(model, windows, cache_root=Path(tmp), batch_size=args.batch_size)
            disk.append(timed(functools.partial(fresh.cache, EVAL)))
        plain.append(timed(lambda: [model(b) for b in windows.split(args.batch_size)]))
    baseline_key = next(name for name in operations if name.startswith(baseline_name))
    results = {
        "checkpoint": args.checkpoint,
        "arch": model.arch,
        "controllers": len(model.controller_names),
        "experts": [list(s) for s in model.coefficient_slot_shapes],
        "top_k": top_k,
        "batch": list(batch.shape),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "median_ms": {name: 1000 * statistics.median(times) for name, times in seconds.items()},
        "over_plain_forward": ratios,
        "disk_capture_windows": len(windows),
        "disk_capture_over_plain_forward": statistics.median(d / p for d, p in zip(disk, plain)),
        "model_latency_over_static_mixture": 1 / ratios[baseline_key],
    }
    write_results("bench_moe", results, markdown(results))


def markdown(r: dict) -> str:
    lines = [
        f"# MoE benchmark ({r['checkpoint']}: {r['arch']}, {r['controllers']} routers, top-{r['top_k'][0]} of "
        f"{r['experts'][0][0]} experts; batch {r['batch'][0]} x {r['batch'][1]} tokens, {r['repeats']} interleaved "
        f"rounds, {r['threads']} thread(s))",
        "",
        "Ratios to the plain forward of the same round, median over rounds (`benchmarks/bench_moe.py`).",
        "",
        "| operation | median ms | / plain forward |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {r['median_ms'][name]:.1f} | {ratio:.3f} |" for name, ratio in r["over_plain_forward"].items()
    ]
    lines += [
        "",
        f"- on-disk capture of {r['disk_capture_windows']} windows (safetensors shards) / plain forwards of the same "
        f"windows: {r['disk_capture_over_plain_forward']:.3f}",
        f"- latency of the model / its static mixture (every expert for every token): "
        f"{r['model_latency_over_static_mixture']:.3f}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
