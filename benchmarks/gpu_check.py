"""GPU check for MUDDPythia at the official 1.4B size: official layout round trip, capture and replay.

What it does, in the order a user's audit would:

1. builds a randomly initialised MUDDPythia with the official 1.4B config (24 layers, dim 2048, vocab
   50432, 2048-token context; ``fca_workbench.models.loading.OFFICIAL_1P4B_CONFIG``) in bf16 directly on the
   device, with controllers and ``dense_bs`` perturbed so that coefficients vary with the input;
2. saves it in the official Hugging Face layout (``config.json`` with ``auto_map``, safetensors shards
   plus ``model.safetensors.index.json``), next to trap ``modeling_muddpythia.py`` /
   ``configuration_muddpythia.py`` files that leave a marker if anything imports them;
3. loads it back through ``fca_workbench.models.load_model`` (strict keys, ``auto_map`` ignored) and moves
   it to the device, as ``fca audit --device cuda --dtype bfloat16`` does, and checks every tensor is
   bit-identical to what was saved;
4. on a few windows of seeded random token ids, through the replay session users run (``ReplaySession``):
   times a plain forward, the capture (``cache``: forward with coefficients, the model fingerprint, shards
   on disk) and the ``correct``, ``cross_input`` and ``token_shuffle`` replays (``nll``); prints tokens/s and peak GPU memory of each, the audit's automatic batch
   size and its per-window memory estimate against the measured peak;
5. checks that ``correct`` replay reproduces the unperturbed per-token NLL and that the two reassignments
   change it. Exit status 0 only when every check passes.

``--tiny`` runs the same steps with a small config on the CPU (a minute on a laptop), for testing the
script without a GPU. ``benchmarks/gpu_check.sh`` wraps this with a hard time limit.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch
from bench_session import handed_in

from fca_workbench.audit.budget import audit_batch_size, window_bytes
from fca_workbench.audit.inputs import EVAL
from fca_workbench.models import load_model
from fca_workbench.models.loading import CODE_FILES_NAMED_BY_AUTO_MAP, OFFICIAL_1P4B_CONFIG
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM, MultiwayDynamicDenseBlock
from fca_workbench.models.official_layout import save_official

TINY_OVERRIDES = dict(
    n_layer=4, dim=128, n_head=4, n_local_heads=4, intermediate_size=512, vocab_size=1024, block_size=256
)
REPLAYS = ("correct", "cross_input", "token_shuffle")
CORRECT_TOLERANCE = 1e-3  # nats, largest per-token |correct - unperturbed| accepted (bit-exact expected)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small config on the CPU (tests the script)")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--windows", type=int, default=16, help="number of windows (default 16)")
    parser.add_argument("--window", type=int, default=None, help="tokens per window (default: the context, 2048)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the audit's automatic choice")
    parser.add_argument("--shards", type=int, default=2, help="safetensors shards to write (default 2)")
    parser.add_argument("--workdir", default=None, help="where to write the checkpoint and cache (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and cache folder")
    parser.add_argument("--json", default=None, help="also write the figures as JSON here")
    return parser.parse_args(argv)


class Clock:
    """Wall time of a phase (device synchronised) and, on CUDA, its peak memory above the start."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base = 0  # bytes allocated on entering (CUDA)
        self.start = 0.0
        self.seconds = 0.0
        self.peak: int | None = None  # bytes (CUDA; None elsewhere)
        self.above_base: int | None = None

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self):
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.sync()
        self.seconds = time.perf_counter() - self.start
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.peak, self.above_base = peak, peak - self.base
        else:
            self.peak = self.above_base = None
        return False


def gib(n):
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def build_model(config, dtype, device, seed=0) -> MUDDPythiaForCausalLM:
    """Random init directly on the device in ``dtype``; controllers and ``dense_bs`` made input-dependent
    (the from-scratch init has silent controllers, which would make every reassignment a no-op)."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MUDDPythiaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for block in model.dynamic_dense:  # a ModuleList: its items are typed as plain Modules
            cast(MultiwayDynamicDenseBlock, block).w2.weight.normal_(0.0, 0.05)
        for bias in model.dense_bs:
            bias.add_(0.1 * torch.randn_like(bias))
    return model.eval()


@torch.no_grad()
def plain_forward(model, windows, batch_size, device):
    for start in range(0, len(windows), batch_size):
        model(windows[start : start + batch_size].to(device))


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    dtype = getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch (use --tiny to run on the CPU)", file=sys.stderr)
        return 2
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}", end="")
    print(f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    fields: dict[str, Any] = {k: v for k, v in OFFICIAL_1P4B_CONFIG.items() if k != "auto_map"}
    if args.tiny:
        fields.update(TINY_OVERRIDES)
    config = MUDDPythiaConfig(**fields)
    window = args.window or config.block_size
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    folder, cache_dir = workdir / "checkpoint", workdir / "cache"
    results = {"device": str(device), "dtype": args.dtype, "tiny": args.tiny, "windows": args.windows, "window": window}
    checks = {}
    clock = Clock(device)
    t_total = time.perf_counter()
    try:
        # 1-2: build and save in the official layout
        with clock:
            original = build_model(config, dtype, device)
        params = sum(p.numel() for p in original.parameters())
        print(
            f"built {config.n_layer} layers, dim {config.dim}, {params:,} parameters in {args.dtype}: {clock.seconds:.1f} s"
        )
        with clock:
            save_official(original, folder, weights="safetensors", shards=args.shards)
        marker = folder / "IMPORTED"
        for name in CODE_FILES_NAMED_BY_AUTO_MAP:
            (folder / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise RuntimeError('imported')\n")
        written = sorted(p.name for p in folder.iterdir())
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"saved official layout ({size / 2**30:.2f} GiB: {', '.join(written)}): {clock.seconds:.1f} s")
        results.update(params=params, save_s=clock.seconds)

        # 3: load it back the way the audit does
        with clock:
            model = load_model(folder, dtype).to(device)  # type: ignore[arg-type]  # transformers: @wraps(Module.to)
        print(f"load_model + .to({device}): {clock.seconds:.1f} s")
        results["load_s"] = clock.seconds
        saved, loaded = original.state_dict(), model.state_dict()
        checks["round_trip_bit_exact"] = saved.keys() == loaded.keys() and all(
            torch.equal(saved[k], loaded[k]) for k in saved
        )
        checks["auto_map_code_not_imported"] = not marker.exists()
        del original, saved
        if device.type == "cuda":
            torch.cuda.empty_cache()

        generator = torch.Generator().manual_seed(1234)
        windows = torch.randint(0, config.vocab_size, (args.windows, window), generator=generator)
        tokens = windows.numel()
        batch_size = args.batch_size or audit_batch_size(model, window, device)
        batch_size = min(batch_size, args.windows)
        estimate = window_bytes(model, window)
        print(
            f"{args.windows} windows x {window} tokens, batch size {batch_size}"
            f" ({'given' if args.batch_size else 'audit_batch_size'}; estimate {gib(estimate)} per window)"
        )
        results.update(batch_size=batch_size, window_bytes_estimate=estimate)

        # 4: plain forward, capture, replays
        plain_forward(model, windows[:batch_size], batch_size, device)  # warm-up
        phases = {}
        with clock:
            plain_forward(model, windows, batch_size, device)
        phases["forward"] = clock
        clock = Clock(device)
        with clock:
            fingerprint_started = time.perf_counter()
            handed_in(model, windows, device=device).fingerprint  # noqa: B018 (timed)
            fingerprint_s = time.perf_counter() - fingerprint_started
        print(f"model fingerprint (also inside capture): {fingerprint_s:.1f} s")
        session = handed_in(model, windows, cache_root=cache_dir, batch_size=batch_size, device=device)
        clock = Clock(device)
        with clock:
            cache = session.cache(EVAL)
        phases["capture"] = clock
        per_token = {"unperturbed": cache.nll(torch.arange(len(windows)))}
        for condition in REPLAYS:
            clock = Clock(device)
            with clock:
                per_token[condition] = session.nll(condition)
            phases[condition] = clock

        print(f"\n{'phase':14s} {'seconds':>8s} {'tokens/s':>10s} {'peak GPU memory':>16s} {'above weights':>14s}")
        for name, phase in phases.items():
            rate = tokens / phase.seconds
            print(f"{name:14s} {phase.seconds:8.2f} {rate:10.0f} {gib(phase.peak):>16s} {gib(phase.above_base):>14s}")
            results[name] = {
                "seconds": phase.seconds,
                "tokens_per_s": rate,
                "peak_bytes": phase.peak,
                "peak_above_weights_bytes": phase.above_base,
            }
        if device.type == "cuda":
            overall = torch.cuda.max_memory_allocated(device)
            measured = max(p.above_base for p in phases.values() if p.above_base is not None) / batch_size
            print(
                f"\npeak GPU memory of the last phase {gib(overall)}; measured per window {gib(measured)}"
                f" vs estimate {gib(estimate)} (audit_batch_size divides free memory by 1.5 x estimate)"
            )
            results["measured_window_bytes"] = measured
            checks["window_estimate_covers_measured"] = estimate * 1.5 >= measured

        # 5: checks
        unperturbed = per_token["unperturbed"]
        diff = (per_token["correct"] - unperturbed).abs().max().item()
        checks["correct_equals_unperturbed"] = diff <= CORRECT_TOLERANCE
        print(
            f"\nmean NLL unperturbed {unperturbed.double().mean():.4f}; correct - unperturbed: max |diff| {diff:.3g}"
            f" ({'bit-exact' if torch.equal(per_token['correct'], unperturbed) else 'not bit-exact'})"
        )
        results["correct_max_abs_diff"] = diff
        for condition in ("cross_input", "token_shuffle"):
            delta = (per_token[condition].double() - per_token["correct"].double()).mean().item()
            results[f"delta_{condition}"] = delta
            print(f"{condition}: delta NLL vs correct {delta:+.4f}")
            checks[f"{condition}_changes_nll"] = bool(torch.isfinite(per_token[condition]).all()) and delta != 0.0
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results["total_s"] = time.perf_counter() - t_total
    results["checks"] = checks
    print(f"\ntotal {results['total_s']:.1f} s")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
