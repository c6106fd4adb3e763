"""Where the per-layer sweep's time goes, and how close prefix reuse comes to its limit (ratios only:
absolute times are noise on a shared machine).

    .venv/bin/python benchmarks/bench_sweep.py [--checkpoints data/checkpoints/featuregate-s0 ...]
        [--windows 16] [--batch-size 16] [--repeats 2]

One thread. Per checkpoint, on the same evenly sampled eval windows (profiles from as many calibration ones):

- **sweep**: the replay session's per-layer sweep (``ReplaySession.sweep``: prefix reuse) against its L x K
  full frozen replays (``ReplaySession.nll`` at each layer, what a sweep costs without prefix reuse), timed in
  turns;
- **limit**: the same kernels without any bookkeeping, on one batch: one prefix pass (the model's own layer
  stepping, ``run_blocks`` keeping the states, then head + NLL) plus, for each layer l,
  the blocks from ``resume_layer(l)`` and the head + NLL (``head_nll``), K times, over L x K frozen forwards
  + NLL as the audit runs them (``audit.forward.forward_nll``: the head + NLL chunked too). The issue's limit
  counts the blocks only: mean over l of (L - resume_layer(l)) / L, plus one prefix pass per batch (1 / LK);
  for Dense and FeatureGate that is (L+1)/2L + 1/(LK);
- **head share**: the head + NLL over a frozen forward + NLL, from whole logits (``next_token_nll``, over a
  forward that computes them) and chunked (``head_nll``, over the audit's forward): the part of every replay
  that prefix reuse cannot skip;
- **profile**: torch.profiler's self CPU time of one prefix-reuse sweep by operator, largest first.

Writes benchmarks/results/bench_sweep.json and .md.
"""

import argparse
import tempfile
from pathlib import Path

import torch
from bench_session import handed_in
from results_file import write_results
from timing import best_of_each
from torch.profiler import ProfilerActivity, profile

from fca_workbench.adapters.protocol import as_values
from fca_workbench.adapters.sites import sites
from fca_workbench.audit.forward import forward_nll
from fca_workbench.audit.inputs import EVAL
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.models import head_nll, load_model, next_token_nll
from fca_workbench.results.conditions import BASELINES, REFERENCE


@torch.no_grad()
def sweep_limit(
    model, batch: torch.Tensor, coefficients: list[torch.Tensor], conditions: int, repeats: int = 3
) -> dict:
    """The prefix-reuse limit of a sweep of ``conditions`` per layer, from the kernels' own times on ``batch``."""
    layers = len(coefficients)

    def prefix_pass():
        output, _, states = model.run_blocks(model.embed(batch), 0, coefficients, keep_states=True)
        head_nll(model, output, batch)
        return output, states

    output, states = prefix_pass()
    starts = [model.resume_layer(layer) for layer in range(layers)]
    assert states is not None  # kept for every model that steps layer by layer

    def resumed():
        for start in starts:
            head_nll(model, model.run_blocks(states[start], start, coefficients)[0], batch)

    seconds, _ = best_of_each(
        repeats,
        {
            "forward": lambda: forward_nll(model, batch, as_values(coefficients)),
            "forward_whole_logits": lambda: next_token_nll(model(batch, coefficients=coefficients).logits, batch),
            "prefix_pass": prefix_pass,
            "resumed": resumed,
            "head_logits": lambda: next_token_nll(model.head(output), batch),
            "head_nll": lambda: head_nll(model, output, batch),
        },
    )
    naive = layers * conditions * seconds["forward"]
    return {
        "limit": (seconds["prefix_pass"] + conditions * seconds["resumed"]) / naive,
        "blocks_only_limit": sum(layers - s for s in starts) / layers**2 + 1 / (layers * conditions),
        "head_share_logits": seconds["head_logits"] / seconds["forward_whole_logits"],
        "head_share_fused": seconds["head_nll"] / seconds["forward"],
        "seconds": seconds,
    }


def operator_profile(fn, top: int = 8) -> list[tuple[str, float]]:
    """(operator, share of the self CPU time) of ``fn``'s largest operators."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [(e.key, e.self_cpu_time_total / total) for e in events[:top]]


def bench(checkpoint: str, n: int, batch_size: int, repeats: int, tmp: Path) -> dict:
    model = load_model(checkpoint).eval()
    tokenizer = load_tokenizer(checkpoint)
    windows = load_windows(split_path("eval"), tokenizer, 256, n)
    calib = load_windows(split_path("calibration"), tokenizer, 256, n)
    session = handed_in(model, windows, calib, tmp, batch_size)
    layers = session.cache(EVAL).num_layers
    swept = [c for c in session.conditions if c not in BASELINES]
    session.profiles  # noqa: B018 (captured and estimated before anything is timed)

    def full_forwards():
        for site in sites(model.controller_layers):
            for condition in swept:
                session.nll(condition, site.controllers)
        session.nll(REFERENCE)  # the sweep's reference, which it checks against the live run

    seconds, _ = best_of_each(repeats, {"prefix": lambda: session.sweep(swept), "full_forward": full_forwards})
    indices = next(session.eval_cache.shard_indices())
    limit = sweep_limit(model, windows[indices], session.coefficients(REFERENCE, indices), len(swept))
    ratio = seconds["prefix"] / seconds["full_forward"]
    return {
        "checkpoint": checkpoint,
        "arch": model.arch,
        "windows": len(windows),
        "window": windows.shape[1],
        "layers": layers,
        "conditions": len(swept),
        "resume_layers": [model.resume_layer(c) for c in range(layers)],
        "sweep_seconds": seconds,
        "prefix_over_full_forward": ratio,
        **limit,
        "prefix_over_limit": ratio / limit["limit"],
        "profile_prefix_sweep": operator_profile(lambda: session.sweep(swept)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoints", nargs="+", default=["data/checkpoints/featuregate-s0", "data/checkpoints/muddpythia-s0"]
    )
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the sides taking turns; the fastest counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            bench(c, args.windows, args.batch_size, args.repeats, Path(tmp) / str(i))
            for i, c in enumerate(args.checkpoints)
        ]
    r = {
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "checkpoints": results,
    }
    write_results("bench_sweep", r, markdown(r))


def markdown(r: dict) -> str:
    lines = [
        f"# Per-layer sweep: prefix reuse against full forwards and its limit (batch {r['batch_size']}, "
        f"{r['threads']} thread, fastest of {r['repeats']} rounds taken in turns)",
        "",
        "| checkpoint | L x K | prefix / full forwards | limit (kernels only, head + NLL counted) | prefix / limit "
        "| blocks-only limit | head + NLL share of a forward: logits / head_nll |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in r["checkpoints"]:
        lines.append(
            f"| {Path(c['checkpoint']).name} ({c['windows']} windows x {c['window']}) | {c['layers']} x "
            f"{c['conditions']} | {c['prefix_over_full_forward']:.3f} | {c['limit']:.3f} | "
            f"{c['prefix_over_limit']:.3f} | {c['blocks_only_limit']:.3f} | "
            f"{c['head_share_logits']:.1%} / {c['head_share_fused']:.1%} |"
        )
    for c in r["checkpoints"]:
        s = c["sweep_seconds"]
        lines += [
            "",
            f"## {Path(c['checkpoint']).name}",
            "",
            f"Seconds: sweep prefix {s['prefix']:.1f}, full forwards {s['full_forward']:.1f}. Resume layers "
            f"{c['resume_layers']}. Limit kernels (one batch, s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in c["seconds"].items())
            + ".",
            "",
            "Prefix-reuse sweep, self CPU time by operator (torch.profiler):",
            "",
        ]
        lines += [f"- {name}: {share:.1%}" for name, share in c["profile_prefix_sweep"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
