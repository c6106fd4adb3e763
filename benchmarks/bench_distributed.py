"""Audits on several processes: windows/s of ``fca audit`` in one process and under torchrun.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_distributed.py [--checkpoint data/checkpoints/featuregate-s0]
        [--windows 64] [--rounds 2]
    .venv/bin/python benchmarks/bench_distributed.py --gpu [--windows 16]   # run by benchmarks/gpu_check.sh
    .venv/bin/python benchmarks/bench_distributed.py --gpu --tiny           # the same steps on the CPU (gloo)

CPU (default): each round runs, in turn, the one-process audit and the two-rank audit
(``torchrun --standalone --nproc-per-node 2``, gloo, one thread per rank) of the same checkpoint and windows,
each into a fresh cache. windows/s = eval windows / wall time of the whole command, which is what a user
waits for: process start and model load, capture of the eval and calibration windows, the replays, and the
work rank 0 does alone (bootstrap, execution audit, files). The 2-rank / 1-process ratio is taken per round
(the median over rounds is reported); both audits' figures are checked equal within 1e-6.

GPU (``--gpu``): a randomly initialised MUDDPythia with the official 1.4B config in bf16 (``gpu_check.build_model``)
saved in the official layout with the shipped tokenizer, audited at 2048 tokens per window in one process and
under ``torchrun --nproc-per-node 1`` (NCCL), and on every GPU of the machine when it has more than one; the
figures of each must equal the one-process audit's within 1e-6. ``--tiny``: a small config on the CPU (gloo).

Writes benchmarks/results/bench_distributed.json and .md (``--gpu``: bench_distributed_gpu.*).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ("conditions", "retention", "variance", "variation")
TOLERANCE = 1e-6


def command(audit_args: list, ranks: int | None) -> list[str]:
    """``python -m fca_workbench audit ...``; under torchrun (``python -m torch.distributed.run``) unless ranks is None."""
    launcher = [] if ranks is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    return [sys.executable, *launcher, "-m", "fca_workbench", "audit", *map(str, audit_args)]


def timed_audit(audit_args: list, out: Path, ranks: int | None) -> tuple[float, dict]:
    """Wall seconds of the whole command and the audit it wrote."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        command([*audit_args, "--out", out, "--cache", out / "cache"], ranks),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"bench_distributed: audit failed ({' '.join(command(audit_args, ranks))}):\n{result.stderr[-3000:]}")
    return seconds, json.loads((out / "audit.json").read_text())


def largest_difference(one: dict, other: dict) -> float:
    """The largest absolute difference between the numbers of two audits' figures."""

    def leaves(tree, path=""):
        if isinstance(tree, dict):
            return {k: v for key, value in tree.items() for k, v in leaves(value, f"{path}.{key}").items()}
        if isinstance(tree, list):
            return {k: v for i, value in enumerate(tree) for k, v in leaves(value, f"{path}[{i}]").items()}
        return {path: tree} if isinstance(tree, float) else {}

    a = leaves({k: one.get(k) for k in FIGURES})
    b = leaves({k: other.get(k) for k in FIGURES})
    if a.keys() != b.keys():
        return float("inf")
    return max((abs(a[k] - b[k]) for k in a), default=0.0)


def write(name: str, results: dict, lines: list[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cpu_scaling(args) -> int:
    audit_args = [
        args.checkpoint,
        "--max-windows",
        args.windows,
        "--window",
        args.window,
        "--batch-size",
        args.batch_size,
    ]
    load = [os.getloadavg()]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench_distributed_") as tmp:
        for round_ in range(args.rounds):
            one_s, one = timed_audit(audit_args, Path(tmp) / f"one-{round_}", None)
            two_s, two = timed_audit(audit_args, Path(tmp) / f"two-{round_}", 2)
            rounds.append(
                {
                    "one_process_s": one_s,
                    "two_ranks_s": two_s,
                    "speedup": one_s / two_s,
                    "largest_difference": largest_difference(one, two),
                }
            )
            print(
                f"round {round_ + 1}: 1 process {one_s:.1f} s, 2 ranks {two_s:.1f} s, "
                f"speed-up {one_s / two_s:.2f}x, figures differ by at most {rounds[-1]['largest_difference']:.1e}"
            )
    load.append(os.getloadavg())
    windows = one["data"]["eval"]["windows"]
    speedup = statistics.median(r["speedup"] for r in rounds)
    results = {
        "checkpoint": args.checkpoint,
        "eval_windows": windows,
        "window": args.window,
        "batch_size": args.batch_size,
        "rounds": rounds,
        "speedup_median": speedup,
        "load_average_before_after": load,
        "cpus": os.cpu_count(),
    }
    lines = [
        "# fca audit on 1 and 2 CPU ranks (gloo, one thread per rank)",
        "",
        f"`OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_distributed.py --windows {args.windows} "
        f"--rounds {args.rounds}`: {Path(args.checkpoint).name}, {windows} eval (and calibration) windows of "
        f"{args.window} tokens, batch size {args.batch_size}; whole command timed (start, load, capture, replay, "
        f"rank 0's figures and execution audit), fresh cache each run, the two alternated. {os.cpu_count()} CPUs; "
        f"load average (1 min) {load[0][0]:.2f} before, {load[1][0]:.2f} after.",
        "",
        "| round | 1 process: windows/s | 2 ranks: windows/s | speed-up | largest figure difference |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {windows / r['one_process_s']:.2f} | {windows / r['two_ranks_s']:.2f} | "
            f"{r['speedup']:.2f}x | {r['largest_difference']:.1e} |"
            for i, r in enumerate(rounds)
        ),
        "",
        f"Median speed-up of 2 ranks over 1 process: **{speedup:.2f}x**.",
    ]
    write("bench_distributed", results, lines)
    return 0 if all(r["largest_difference"] <= TOLERANCE for r in rounds) else 1


def gpu_single_rank(args) -> int:
    """The MUDDPythia-1.4B shape audited in one process and under torchrun with NCCL (``--tiny``: gloo, CPU)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import TINY_OVERRIDES, build_model  # the 1.4B-shaped random model of the GPU check

    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.models.loading import OFFICIAL_1P4B_CONFIG
    from fca_workbench.models.muddpythia import MUDDPythiaConfig
    from fca_workbench.models.official_layout import save_official

    if not args.tiny and not torch.cuda.is_available():
        print("bench_distributed: no CUDA device visible to torch (use --tiny to run on the CPU)", file=sys.stderr)
        return 2
    device = "cpu" if args.tiny else "cuda"
    fields: dict[str, Any] = {k: v for k, v in OFFICIAL_1P4B_CONFIG.items() if k != "auto_map"}
    if args.tiny:
        fields.update(TINY_OVERRIDES)
    tokenizer = load_tokenizer()  # the shipped one: 4096 tokens, within the 1.4B vocabulary of 50432
    config = MUDDPythiaConfig(**{**fields, "vocab_size": max(fields["vocab_size"], len(tokenizer))})
    window = min(args.window, config.block_size) if args.tiny else config.block_size
    workdir = Path(tempfile.mkdtemp(prefix="bench_distributed_gpu_"))
    try:
        folder = workdir / "checkpoint"
        save_official(build_model(config, torch.bfloat16, device), folder, weights="safetensors", shards=2)
        tokenizer.save_pretrained(folder)
        audit_args = [
            folder,
            "--device",
            device,
            "--dtype",
            "bfloat16",
            "--window",
            window,
            "--max-windows",
            args.windows,
        ]
        runs = {"1 process": None, "torchrun, 1 rank": 1}
        gpus = torch.cuda.device_count() if not args.tiny else 1
        if gpus > 1:
            runs[f"torchrun, {gpus} ranks"] = gpus
        results, reference = {}, None
        for name, ranks in runs.items():
            seconds, audit = timed_audit(audit_args, workdir / name.replace(" ", "_").replace(",", ""), ranks)
            reference = reference or audit
            results[name] = {
                "seconds": seconds,
                "windows_per_s": args.windows / seconds,
                "largest_difference": largest_difference(reference, audit),
                "world_size": audit["settings"]["world_size"],
                "batch_size": audit["settings"]["batch_size"],
            }
            print(
                f"{name}: {seconds:.1f} s, {args.windows / seconds:.2f} windows/s, "
                f"figures differ from 1 process by at most {results[name]['largest_difference']:.1e}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    backend = "gloo" if args.tiny else "NCCL"
    lines = [
        f"# MUDDPythia-1.4B shape: fca audit in one process and under torchrun ({backend})",
        "",
        f"`benchmarks/bench_distributed.py --gpu{' --tiny' if args.tiny else ''} --windows {args.windows}` on "
        f"{torch.cuda.get_device_name() if not args.tiny else 'the CPU (tiny config)'}: {args.windows} windows of "
        f"{window} tokens, bf16; whole command timed.",
        "",
        "| run | ranks | batch size | windows/s | largest figure difference vs 1 process |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['world_size']} | {r['batch_size']} | {r['windows_per_s']:.2f} | {r['largest_difference']:.1e} |"
            for name, r in results.items()
        ),
    ]
    write(
        "bench_distributed_gpu" + ("_tiny" if args.tiny else ""),
        {"device": device, "window": window, "runs": results},
        lines,
    )
    return 0 if all(r["largest_difference"] <= TOLERANCE for r in results.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/featuregate-s0")
    parser.add_argument("--windows", type=int, default=64, help="eval and calibration windows (default 64)")
    parser.add_argument("--window", type=int, default=256, help="tokens per window (default 256; --gpu: 2048)")
    parser.add_argument("--batch-size", type=int, default=4, help="windows per shard (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds of 1 process and 2 ranks (default 2)")
    parser.add_argument("--gpu", action="store_true", help="the MUDDPythia-1.4B shape, 1 process vs torchrun NCCL")
    parser.add_argument("--tiny", action="store_true", help="with --gpu: a small config on the CPU (gloo)")
    args = parser.parse_args()
    return gpu_single_rank(args) if args.gpu else cpu_scaling(args)


if __name__ == "__main__":
    sys.exit(main())
