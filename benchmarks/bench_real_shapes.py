"""The audit's overheads at real model shapes, with seeded random weights, as ratios measured in one run.

    benchmarks/bench_real_shapes.py                           # every shape and dtype, each in a process of its own
    benchmarks/bench_real_shapes.py --shape olmoe-1b-7b-2l --dtype float32   # one of them, in this process
    benchmarks/bench_real_shapes.py --device cuda             # the same on a GPU (benchmarks/gpu_check.sh)
    benchmarks/bench_real_shapes.py --tiny --out DIR          # small widths, seconds (tests/test_benchmarks_shapes.py)

The shapes (``SHAPES``): MUDDPythia-1.4B (the native model at the official size, built as
``benchmarks/gpu_check.py`` builds it) and 2-layer slices of Mixtral-8x7B, OLMoE-1B-7B and Mamba-2.8B
(transformers configs at the real widths, ``num_hidden_layers=2``), each wrapped as ``fca audit`` wraps it,
at 2,048 tokens (``--window``: fewer). Each round times, in turn on the same windows: forward + NLL as a user
runs the model (its default kernels: for the MoE slices the experts implementation transformers uses by default,
``grouped_mm`` where it is), the denominator of every ratio; the replay session's on-disk capture
(``ReplaySession.cache``, into a fresh folder, the fingerprint known as the memo gives it to every audit of a
checkpoint after its first, ``audit.fingerprint_memo``); the session's ``correct`` replay of that cache
(``ReplaySession.nll``) and, for the MoE
slices, forward + NLL with eager experts (capture and replay run the default kernel, as ``adapters/hf.py`` leaves it). The model fingerprint (every
weight hashed, in threads) is timed once apart: what a checkpoint's first audit adds to its capture. One warm-up
round, then the median over ``--repeats`` rounds of each round's ratios.
Also: cache bytes per token against the bytes of the coefficients themselves (fp32) and against every tensor
the cache stores; peak RSS against weights + one batch (the audit's own estimate, ``audit.budget.window_bytes``);
and, for the MoE slices, whether the default experts implementation gives bit-identical NLL to eager on the
static conditions (``layer_mean``, ``layer_mean_topk``, profiles from the same windows).

Writes benchmarks/results/real_shapes.json and .md (``--out``: elsewhere), merging each shape in as it ends.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")  # fixed before torch starts its thread pool

import argparse
import contextlib
import gc
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from bench_session import handed_in
from filelock import FileLock
from gpu_check import TINY_OVERRIDES, build_model
from results_file import RESULTS

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.placement import HASH_THREADS
from fca_workbench.audit.budget import window_bytes
from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.session import ReplaySession
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, write_atomic
from fca_workbench.models import next_token_nll
from fca_workbench.models.loading import OFFICIAL_1P4B_CONFIG
from fca_workbench.models.muddpythia import MUDDPythiaConfig

THREADS = 2
NAME = "real_shapes"
STATIC = ("layer_mean", "layer_mean_topk")
GOALS = {  # issue 36's goals
    "capture_over_forward_nll": 1.05,
    "replay_over_forward_nll": 1.05,
    "cache_over_coefficients": 1.2,
    "peak_rss_over_weights_batch": 1.5,
}


class Shape(NamedTuple):
    kind: str  # a transformers config class's name, or "muddpythia"
    real: dict[str, int]  # config fields at the real width
    tiny: dict[str, int]  # config fields with ``--tiny``
    window: int
    tiny_window: int
    dtypes: tuple[str, ...]  # those it runs in on this CPU


SHAPES = {
    "muddpythia-1.4b": Shape("muddpythia", {}, TINY_OVERRIDES, 2048, 64, ("float32", "bfloat16")),
    "mixtral-8x7b-2l": Shape(
        "MixtralConfig",
        dict(num_hidden_layers=2),
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
        ),
        2048,
        32,
        ("float32", "bfloat16"),  # fp32: 12.3 GB of weights, 17.1 GB resident at its peak on a 24 GB machine
    ),
    "olmoe-1b-7b-2l": Shape(
        "OlmoeConfig",
        dict(num_hidden_layers=2, intermediate_size=1024),  # OlmoeConfig's default is 2048; OLMoE-1B-7B's 1024
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_experts=16,
            num_experts_per_tok=4,
            vocab_size=512,
        ),
        2048,
        32,
        ("float32", "bfloat16"),
    ),
    "mamba-2.8b-2l": Shape(
        "MambaConfig",
        dict(hidden_size=2560, num_hidden_layers=2, vocab_size=50280),
        dict(hidden_size=64, num_hidden_layers=2, vocab_size=512, state_size=8),
        2048,
        32,
        ("float32", "bfloat16"),
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="one shape, in this process (default: every one)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="with --shape (default: each it runs in)")
    parser.add_argument("--tiny", action="store_true", help="small widths: tests the script in seconds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--windows", type=int, default=1, help="windows per batch (one batch; default 1)")
    parser.add_argument("--window", type=int, default=None, help="tokens per window (default: the shape's)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds after one warm-up (default 2)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for real_shapes.json and .md")
    return parser.parse_args(argv)


def build(shape: str, tiny: bool, dtype: torch.dtype, device: torch.device):
    """The shape's model with seeded random weights, seen as ``fca audit`` sees it; and the name of the
    experts implementation transformers would have used (None where the model has no experts)."""
    kind, real, small, *_ = SHAPES[shape]
    fields = small if tiny else real
    if kind == "muddpythia":
        config: dict[str, Any] = {k: v for k, v in OFFICIAL_1P4B_CONFIG.items() if k != "auto_map"} | fields
        return build_model(MUDDPythiaConfig(**config), dtype, device), None
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, kind)(**fields), dtype=dtype)
    default = model.get_experts_implementation()  # what capture and replay run too
    controlled = TransformersControlled(model.eval())
    routed = any(kind.experts is not None for kind in controlled.kinds)
    return controlled, default if routed else None


def resident() -> tuple[int, int]:
    """This process's resident bytes now and their high-water mark since ``reset_high_water`` (Linux's
    /proc/self/status VmRSS and VmHWM; elsewhere the process's peak for both)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return peak, peak


def reset_high_water() -> None:
    """Start the resident high-water mark again from the present (Linux: ``5`` into /proc/self/clear_refs), so
    a stage's peak is its own, not the model build's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def logits_of(model, batch: torch.Tensor) -> torch.Tensor:
    output = model(batch)
    return getattr(output, "logits", output)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_bytes(model, windows: torch.Tensor) -> tuple[int, str]:
    """One batch's working memory: the audit's estimate, or (a model it cannot size) its logits and their
    fp32 log-softmax alone."""
    try:
        return len(windows) * window_bytes(model, windows.shape[1]), "audit.budget.window_bytes"
    except UserError:
        element = next(model.parameters()).element_size()
        return windows.numel() * model.config.vocab_size * (element + 12), "logits + fp32 log-softmax"


def stored_bytes(folder: Path) -> dict:
    """Bytes on disk of a cache folder, and of the tensors its shards hold (raw, no headers)."""
    from safetensors import safe_open

    files = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    tensors = 0
    for path in folder.glob("shard_*.safetensors"):
        with safe_open(path, framework="pt") as handle:
            for key in handle.keys():
                t = handle.get_tensor(key)
                tensors += t.numel() * t.element_size()
    return {"files": files, "tensors": tensors}


@torch.no_grad()
def measure(shape: str, dtype_name: str, args: argparse.Namespace) -> dict:
    torch.set_num_threads(THREADS)
    device, dtype = torch.device(args.device), getattr(torch, dtype_name)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    model, default_experts = build(shape, args.tiny, dtype, device)
    build_s = time.perf_counter() - started
    rss_built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    window = args.window or (SHAPES[shape].tiny_window if args.tiny else SHAPES[shape].window)
    vocab = model.config.vocab_size
    windows = torch.randint(0, vocab, (args.windows, window), generator=torch.Generator().manual_seed(1234))
    batch = windows.to(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    hf = getattr(model, "model", None)
    tmp = Path(tempfile.mkdtemp(prefix="real_shapes_"))

    peaks: dict[str, int] = {}

    gc.collect()
    rss_at_rest = resident()[0]  # the built model at rest: libraries, interpreter and weights
    baseline = rss_at_rest - weights  # the process without the model

    def timed(fn, name=""):
        sync(device)
        reset_high_water()
        start = time.perf_counter()
        result = fn()
        sync(device)
        peaks.setdefault(name, resident()[1])
        return time.perf_counter() - start, result

    def forward_nll():
        """As a user runs the model: its default experts implementation, which capture and replay run too."""
        return next_token_nll(logits_of(model, batch), batch)

    def eager_forward_nll():
        """The same forward with eager experts, for the ratio of eager over the default kernel."""
        assert hf is not None and default_experts is not None  # a transformers model with experts
        with experts_implementation(hf, "eager", default_experts):
            return forward_nll()

    fingerprint_s, fingerprint = timed(lambda: handed_in(model, windows, device=device).fingerprint, "fingerprint")
    seconds: dict[str, list[float]] = {"forward_nll": [], "capture": [], "replay_correct": []}
    if default_experts is not None:
        seconds["forward_nll_eager_experts"] = []
    session, rss_after = None, {}
    try:
        for round_ in range(1 + args.repeats):
            times = {"forward_nll": timed(forward_nll, "forward_nll")[0]}
            # a fresh session and capture each round, never a reuse; profiles from the same windows
            session = handed_in(model, windows, windows, tmp / f"cache_{round_}", args.windows, device, fingerprint)
            times["capture"], cache = timed(lambda s=session: s.cache(EVAL), "capture")
            times["replay_correct"], correct = timed(lambda s=session: s.nll("correct"), "replay_correct")
            if default_experts is not None:
                times["forward_nll_eager_experts"] = timed(eager_forward_nll, "forward_nll_eager_experts")[0]
            print(f"{shape} {dtype_name} round {round_}: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()))
            if round_ == 0:  # the warm-up: where the peak RSS is reached
                rss_after = {"build": rss_built, **peaks}
            else:
                for name, value in times.items():
                    seconds[name].append(value)
        assert session is not None  # captured in every round, the warm-up included
        cache = session.cache(EVAL)
        unperturbed = cache.nll(torch.arange(len(windows)))
        sizes = stored_bytes(cache.folder)
        coefficient_bytes = windows.numel() * sum(torch.Size(s).numel() for s in model.coefficient_slot_shapes) * 4
        exactness = static_exactness(session, hf, default_experts) if default_experts else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    one_batch, batch_estimate = batch_bytes(model, windows)
    audit_peak = max(rss_after.get(stage, 0) for stage in ("capture", "replay_correct"))

    def ratio(name, over="forward_nll"):
        return statistics.median(t / f for t, f in zip(seconds[name], seconds[over]))

    ratios = {
        "capture_over_forward_nll": ratio("capture"),
        "first_capture_over_forward_nll": statistics.median(
            (t + fingerprint_s) / f for t, f in zip(seconds["capture"], seconds["forward_nll"])
        ),
        "replay_over_forward_nll": ratio("replay_correct"),
        "cache_over_coefficients": sizes["files"] / coefficient_bytes,
        "cache_over_stored_tensors": sizes["files"] / sizes["tensors"],
        "peak_rss_over_weights_batch": (audit_peak - baseline) / (weights + one_batch),
        "forward_peak_rss_over_weights_batch": (rss_after.get("forward_nll", 0) - baseline) / (weights + one_batch),
    }
    if device.type == "cuda":
        ratios["peak_gpu_over_weights_batch"] = torch.cuda.max_memory_allocated(device) / (weights + one_batch)
    if default_experts is not None:
        ratios["eager_over_default_experts"] = ratio("forward_nll_eager_experts")
    return {
        "shape": shape,
        "dtype": dtype_name,
        "device": str(device),
        "tiny": args.tiny,
        "threads": torch.get_num_threads(),
        "batch": list(windows.shape),
        "repeats": args.repeats,
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights_bytes": weights,
        "controllers": len(model.coefficient_slot_shapes),
        "slot_shapes": [list(s) for s in model.coefficient_slot_shapes],
        "default_experts_implementation": default_experts,
        "build_s": build_s,
        "median_s": {name: statistics.median(times) for name, times in seconds.items()},
        "fingerprint_s": fingerprint_s,
        "correct_equals_unperturbed": bool(torch.equal(correct, unperturbed)),
        "cache_bytes_per_token": sizes["files"] / windows.numel(),
        "coefficient_bytes_per_token": coefficient_bytes / windows.numel(),
        "stored_tensor_bytes_per_token": sizes["tensors"] / windows.numel(),
        "rss_start_bytes": rss_start,
        "rss_peak_after_bytes": rss_after,
        "rss_peak_bytes": rss_peak,
        "rss_at_rest_bytes": rss_at_rest,
        "rss_baseline_bytes": baseline,
        "batch_bytes": one_batch,
        "batch_estimate": batch_estimate,
        "ratios": ratios,
        "static_exactness": exactness,
        "load_start": load_start,
        "load": os.getloadavg()[0],
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hash_threads": HASH_THREADS,
    }


@contextlib.contextmanager
def experts_implementation(hf, kind: str, default_experts: str) -> Iterator[None]:
    """``hf``'s experts run through ``kind`` inside the block, through ``default_experts`` again after it."""
    hf.set_experts_implementation(kind)
    try:
        yield
    finally:
        hf.set_experts_implementation(default_experts)


def static_exactness(session: ReplaySession, hf, default_experts: str) -> dict:
    """Per static condition: NLL under ``default_experts`` bit-identical to eager's, and the largest difference."""
    found = {}
    for condition in STATIC:
        if condition not in session.conditions:
            continue
        other = session.nll(condition)
        with experts_implementation(hf, "eager", default_experts):
            eager = session.nll(condition)
        found[condition] = {
            "bit_identical": bool(torch.equal(eager, other)),
            "max_abs_diff": (eager.double() - other.double()).abs().max().item(),
        }
    return found


def merge(out: Path, entry: dict) -> dict:
    """The results file with ``entry`` put in (or replaced) under its shape, dtype and device; runs of the
    script before its denominators were the default kernels' (no ``measured_at``) are dropped, not mixed in."""
    path = out / f"{NAME}.json"
    results = cast(dict, read_json(path)) if path.is_file() else {"runs": {}}
    results["runs"] = {key: run for key, run in results["runs"].items() if "measured_at" in run}
    results["runs"][f"{entry['shape']}/{entry['dtype']}/{entry['device']}"] = entry
    results["runs"] = dict(sorted(results["runs"].items()))
    return results


def markdown(results: dict) -> str:
    lines = [
        "# Real shapes: the audit's overheads at real widths (random seeded weights)",
        "",
        "`benchmarks/bench_real_shapes.py`: each shape in a process of its own, one batch, 1 warm-up + "
        "median of the timed rounds, every ratio taken within one round. The denominator of capture and replay is "
        "forward + NLL under the model's default kernels (the MoE slices' default experts implementation); "
        "capture: with the model fingerprint known, as the memo in the cache root gives it to every audit of a "
        "checkpoint after its first; first capture: plus the fingerprint (every weight hashed, in threads; timed "
        "once apart); eager / default experts: forward + NLL with eager experts over the "
        "default's; cache: bytes on disk per token / the fp32 coefficients' bytes per token (and / every tensor "
        "the cache stores: a router's gate and top-k indices, NLL); peak RSS: the resident high-water mark of capture and of replay "
        "(each stage's own: reset before it), less the process without the model (resident bytes with the model "
        "built and at rest, less its weights: interpreter and libraries), over weights + one batch (the audit's "
        "estimate); the forward's: the same of forward + NLL. Goals: capture <= 1.05, replay <= 1.05, cache <= 1.2, peak RSS <= 1.5. Load: the "
        "1-minute load average at the shape's start and end. Cache fixed bytes: the manifest "
        "and the shards' headers, the same for any number of tokens per shard.",
        "",
        "| shape | dtype | device | batch | threads | load (start–end) | measured | forward+NLL s | capture | first capture | "
        "replay | eager / default experts | cache / coefficients | cache / stored tensors | "
        "cache fixed bytes | peak RSS / (weights + batch) | the forward's | fingerprint s (threads) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"].values():
        q = r["ratios"]
        eager = q.get("eager_over_default_experts")
        default = "/".join(sorted(set(r["default_experts_implementation"].values()))) if eager is not None else ""
        experts = f"{eager:.3f} ({default})" if eager is not None else "n/a"
        tokens = r["batch"][0] * r["batch"][1]
        fixed = (r["cache_bytes_per_token"] - r["stored_tensor_bytes_per_token"]) * tokens  # manifest and headers
        lines.append(
            f"| {r['shape']}{' (tiny)' if r['tiny'] else ''} | {r['dtype']} | {r['device']} | "
            f"{r['batch'][0]} x {r['batch'][1]} | {r['threads']} | {r.get('load_start', r['load']):.1f}–{r['load']:.1f} | {r.get('measured_at', '')} | "
            f"{r['median_s']['forward_nll']:.2f} | {mark(q, 'capture_over_forward_nll')} | "
            f"{q['first_capture_over_forward_nll']:.4f} | "
            f"{mark(q, 'replay_over_forward_nll')} | {experts} | {mark(q, 'cache_over_coefficients')} | "
            f"{q['cache_over_stored_tensors']:.4f} | {fixed:.0f} | {mark(q, 'peak_rss_over_weights_batch')} | "
            f"{q.get('forward_peak_rss_over_weights_batch', float('nan')):.2f} | "
            f"{r['fingerprint_s']:.2f} ({r.get('hash_threads', 1)}) |"
        )
    exact = [(r, c, e) for r in results["runs"].values() for c, e in (r["static_exactness"] or {}).items()]
    if exact:
        lines += ["", "Default experts implementation vs eager on the static conditions (NLL per token):", ""]
        lines += ["| shape | dtype | condition | bit-identical | max abs diff |", "|---|---|---|---|---|"]
        lines += [
            f"| {r['shape']} | {r['dtype']} | {c} | {'yes' if e['bit_identical'] else 'no'} | {e['max_abs_diff']:.3g} |"
            for r, c, e in exact
        ]
    return "\n".join(lines) + "\n"


def mark(ratios: dict, name: str) -> str:
    """A ratio, flagged when above its goal."""
    value = ratios[name]
    return f"{value:.4f}" + (" (over goal)" if value > GOALS[name] else "")


def write(out: Path, results: dict) -> None:
    write_atomic(out / f"{NAME}.json", (json.dumps(results, indent=2) + "\n").encode())
    write_atomic(out / f"{NAME}.md", markdown(results).encode())


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.shape is not None:
        for dtype in [args.dtype] if args.dtype else SHAPES[args.shape].dtypes:
            entry = measure(args.shape, dtype, args)
            with FileLock(Path(tempfile.gettempdir()) / f".{NAME}.lock"):  # shapes run side by side share one file
                write(out, merge(out, entry))
        return 0
    failed = []
    for shape, spec in SHAPES.items():
        dtypes = ("float32", "bfloat16") if args.tiny or args.device != "cpu" else spec.dtypes
        for dtype in dtypes:
            command = [sys.executable, __file__, "--shape", shape, "--dtype", dtype, "--out", str(out)]
            command += ["--device", args.device, "--windows", str(args.windows), "--repeats", str(args.repeats)]
            command += ["--tiny"] * args.tiny + (["--window", str(args.window)] if args.window else [])
            print(f"{shape} {dtype}", flush=True)
            if subprocess.run(command).returncode != 0:
                failed.append(f"{shape}/{dtype}")
    print((out / f"{NAME}.md").read_text())
    if failed:
        print(f"bench_real_shapes: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
