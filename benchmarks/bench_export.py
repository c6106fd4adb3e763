"""What ``fca export --profile layer_mean_topk`` saves on the shipped MoE: parameters, weight bytes and forward
latency of the exported static top-k model against the original, and what it costs in NLL; one run, ratios.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_export.py [--checkpoint data/checkpoints/moe-s0]
        [--calibration-windows 32] [--eval-windows 32] [--batch-size 16] [--repeats 15]

The export keeps k of E experts per MoE block, each taken by every token, so its expert weights are k/E of the
original's. The original routes each token to k experts too, so against it the expert FLOPs per token are the
same and what is saved is the router and the dispatch (which tokens go to which expert); against the static
mixture of every expert (the ``layer_mean`` export, the execution audit's baseline: every expert for every
token) the expert compute is k/E. The forwards of the three models take turns on the same batch of eval windows
(``timing.best_of_each``). The NLL gap is the
exported model's NLL on the eval windows minus the original's: the price of a static routing (the audit's
``layer_mean_topk`` condition, which the export computes exactly).

Writes benchmarks/results/bench_export.json and .md.
"""

import argparse
import functools
import os
import tempfile
from pathlib import Path

import torch
from results_file import write_results
from timing import best_of_each
from transformers import AutoModelForCausalLM

from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.export import export_static
from fca_workbench.foundation.checkpoint import SAFETENSORS_FILE
from fca_workbench.models import next_token_nll

WINDOW = 256
PROFILE = "layer_mean_topk"
MIXTURE = "layer_mean"  # every routed expert for every token, with its mean gate


def expert_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)


@torch.no_grad()
def nll(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> float:
    rows = [next_token_nll(model(batch).logits, batch).double().mean(dim=1) for batch in windows.split(batch_size)]
    return torch.cat(rows).mean().item()


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/moe-s0")
    parser.add_argument("--calibration-windows", type=int, default=32)
    parser.add_argument("--eval-windows", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folders = {
            name: export_static(args.checkpoint, profile, Path(tmp) / name, max_windows=args.calibration_windows)
            for name, profile in (("exported", PROFILE), ("mixture", MIXTURE))
        }
        folders["original"] = Path(args.checkpoint)
        models = {name: AutoModelForCausalLM.from_pretrained(f).eval() for name, f in sorted(folders.items())}
        weight_bytes = {name: (f / SAFETENSORS_FILE).stat().st_size for name, f in folders.items()}
    windows = load_windows(split_path("eval"), load_tokenizer(args.checkpoint), WINDOW, args.eval_windows)
    batch = windows[: args.batch_size]
    seconds, _ = best_of_each(args.repeats, {name: functools.partial(m, batch) for name, m in models.items()})
    experts = {"E": models["original"].config.num_local_experts, "k": models["exported"].config.num_local_experts}
    params = {name: m.num_parameters() for name, m in models.items()}
    expert_params = {name: expert_parameters(m) for name, m in models.items()}
    nlls = {name: nll(m, windows, args.batch_size) for name, m in models.items()}
    results = {
        "checkpoint": args.checkpoint,
        "profile": PROFILE,
        "experts": experts,
        "params": params,
        "expert_params": expert_params,
        "weight_bytes": weight_bytes,
        "forward_seconds": seconds,
        "nll": nlls,
        "ratios": {
            "params": params["exported"] / params["original"],
            "expert_params": expert_params["exported"] / expert_params["original"],
            "weight_bytes": weight_bytes["exported"] / weight_bytes["original"],
            "forward_latency": seconds["exported"] / seconds["original"],
            "forward_latency_vs_mixture": seconds["exported"] / seconds["mixture"],
            "k_over_E": experts["k"] / experts["E"],
        },
        "nll_gap": nlls["exported"] - nlls["original"],
        "settings": {**vars(args), "window": WINDOW, "threads": torch.get_num_threads()},
        "load_average": os.getloadavg()[0],
    }
    write_results("bench_export", results, markdown(results))


def markdown(r: dict) -> str:
    ratios, s = r["ratios"], r["settings"]
    return "\n".join(
        [
            "# fca export: the shipped MoE with its static top-k profile folded in",
            "",
            f"`{r['checkpoint']}`, `--profile {r['profile']}` estimated from {s['calibration_windows']} calibration "
            f"windows; forward of {s['batch_size']} eval windows of {s['window']} tokens, fastest of "
            f"{s['repeats']} alternating rounds, {s['threads']} thread(s), load average {r['load_average']:.1f}.",
            "",
            "| figure | original | exported | ratio |",
            "|---|---:|---:|---:|",
            f"| experts per MoE block | {r['experts']['E']} | {r['experts']['k']} | {ratios['k_over_E']:.3f} (k/E) |",
            f"| parameters | {r['params']['original']:,} | {r['params']['exported']:,} | {ratios['params']:.3f} |",
            f"| expert parameters | {r['expert_params']['original']:,} | {r['expert_params']['exported']:,} "
            f"| {ratios['expert_params']:.3f} |",
            f"| weight bytes (model.safetensors) | {r['weight_bytes']['original']:,} | "
            f"{r['weight_bytes']['exported']:,} | {ratios['weight_bytes']:.3f} |",
            f"| forward latency (ms) | {1e3 * r['forward_seconds']['original']:.1f} | "
            f"{1e3 * r['forward_seconds']['exported']:.1f} | {ratios['forward_latency']:.3f} |",
            f"| forward latency against the static mixture of all {r['experts']['E']} experts (ms, "
            f"`{MIXTURE}` export) | {1e3 * r['forward_seconds']['mixture']:.1f} | "
            f"{1e3 * r['forward_seconds']['exported']:.1f} | {ratios['forward_latency_vs_mixture']:.3f} |",
            f"| eval NLL (nats, {s['eval_windows']} windows) | {r['nll']['original']:.4f} | "
            f"{r['nll']['exported']:.4f} | gap {r['nll_gap']:+.4f} |",
            f"| eval NLL of the `{MIXTURE}` export (nats) | | {r['nll']['mixture']:.4f} | |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
