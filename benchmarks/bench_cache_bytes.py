"""The coefficient cache's bytes against the bytes of the coefficients it holds (a router's dense float32
gate), on the shipped MoE: the issue's figure, 4 eval windows of 64 tokens.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cache_bytes.py [--checkpoint data/checkpoints/moe-s0]
        [--windows 4] [--window 64]

Prints one line: the shards' bytes on disk (every stored tensor, the NLL and the safetensors headers) over the
coefficients' bytes, and the bytes per token and layer of each stored tensor. Goal: at most 1.2x.
"""

import argparse
import tempfile
from pathlib import Path

from safetensors import safe_open

from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/moe-s0")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=int, default=64)
    args = parser.parse_args()

    settings = AuditSettings(
        checkpoint=args.checkpoint, window=args.window, max_windows=args.windows, batch_size=args.windows
    )
    with tempfile.TemporaryDirectory() as folder:
        session = ReplaySession.open(settings, Path(folder), read_now=(EVAL,))
        windows, cache = session.windows(EVAL), session.cache(EVAL)
        stored = sum(cache.shard_path(shard).stat().st_size for shard in range(cache.num_shards()))
        coefficients = sum(c.numel() * c.element_size() for c in cache.coefficients(range(len(windows))))
        with safe_open(cache.shard_path(0), framework="pt") as handle:
            first = [key for key in handle.keys() if key.partition(".")[0] == "layer_0"]
            layer = {key.partition(".")[2] or "coefficient": handle.get_tensor(key) for key in first}
    tokens = windows.numel()
    sizes = ", ".join(f"{name} {t.numel() * t.element_size() / tokens:g}" for name, t in layer.items())
    print(
        f"{args.checkpoint}, {len(windows)} windows x {args.window} tokens: cache {stored} bytes / coefficients "
        f"{coefficients} bytes = {stored / coefficients:.3f}x (bytes per token of layer 0's tensors: {sizes})"
    )


if __name__ == "__main__":
    main()
