"""Prefix reuse on a transformers model: the per-layer sweep of moe-s0 (a Mixtral) against its prefix-reuse
limit, measured in the same run, and against L x K full frozen forwards (ratios only: absolute times are
noise on a shared machine). Times are this process's CPU seconds (``time.process_time``, one thread), which
other processes on a shared machine stretch far less than wall time.

    .venv/bin/python benchmarks/bench_sweep_transformers.py [--checkpoint data/checkpoints/moe-s0]
        [--windows 16] [--batch-size 16] [--repeats 2]

One thread. On evenly sampled eval windows (profiles from as many calibration ones), every condition the
audit replays for the model (``layer_mean_topk`` too):

- **sweep**: the replay session's per-layer sweep (``ReplaySession.sweep``: prefix reuse, a transformers model
  steps by layer, ``adapters.stepping``) and its L x K full frozen replays (``ReplaySession.nll`` at each
  layer, what the sweep cost before), taking turns;
- **limit**: what the sweep would cost if the layers before each replay's first cost nothing: per swept
  (controller, condition), the time its replay spends from the start of its first decoder layer that runs
  (``resume_layer``) to the LM head's call (layers l..L-1, the final norm), plus its LM head and NLL
  (``head_nll``), both timed inside the very sweep round that is timed (``kernel_clock``).
  ``limit_with_prefix_pass`` adds the layers of each batch's one frozen pass (the sweep's reference, which
  it needs as well).

Writes benchmarks/results/bench_sweep_transformers.json and .md.
"""

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import torch
from bench_session import handed_in
from results_file import write_results

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.adapters.sites import sites
from fca_workbench.audit import prefix
from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.sweep import sweep_mode
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.models import head_nll
from fca_workbench.results.conditions import BASELINES, REFERENCE


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


@contextlib.contextmanager
def kernel_clock(model, spans: list[list]):
    """Append ``[kind, layers, head]`` per forward of ``model.run_blocks``: ``kind`` is ``prefix`` for the
    frozen pass that keeps the states, else ``replay``; ``layers``: seconds from the first decoder layer that
    really runs (one replaced by its recorded output has an instance ``forward``) to the LM head's call in
    the forward (a placeholder: the sweep runs the head with the NLL); ``head``: seconds in ``head_nll``
    (the LM head and the NLL, a chunk of rows at a time) after it."""
    started: list[float] = []
    run_blocks = model.run_blocks

    def layer_starts(module, args):
        if not started and "forward" not in module.__dict__:
            started.append(time.process_time())

    def head_called(module, args, output):
        if started and not spans[-1][1]:  # its call in the forward, not ``head_nll``'s chunks after it
            spans[-1][1] = time.process_time() - started[0]

    def timed_run_blocks(state, start, coefficients=None, keep_states=False):
        started.clear()
        spans.append(["prefix" if keep_states else "replay", 0.0, 0.0])
        return run_blocks(state, start, coefficients, keep_states)

    def timed_head_nll(*args):
        start = time.process_time()
        nll = head_nll(*args)
        spans[-1][2] += time.process_time() - start
        return nll

    with contextlib.ExitStack() as stack:
        for layer in model.blocks:
            stack.callback(layer.register_forward_pre_hook(layer_starts).remove)
        stack.callback(model.model.get_output_embeddings().register_forward_hook(head_called).remove)
        model.run_blocks = timed_run_blocks  # on the instance, for this block only
        stack.callback(model.__dict__.pop, "run_blocks")
        stack.enter_context(patched(prefix, "head_nll", timed_head_nll))
        yield


@contextlib.contextmanager
def patched(module, name: str, value):
    """``module.name`` is ``value`` for the block."""
    previous = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, previous)


def bench(checkpoint: str, n: int, batch_size: int, repeats: int, tmp: Path) -> dict:
    model = load_controlled(checkpoint).eval()
    tokenizer = load_tokenizer(checkpoint)
    windows = load_windows(split_path("eval"), tokenizer, 256, n)
    calib = load_windows(split_path("calibration"), tokenizer, 256, n)
    session = handed_in(model, windows, calib, tmp, batch_size)
    cache = session.cache(EVAL)
    swept = [c for c in session.conditions if c not in BASELINES]
    session.profiles  # noqa: B018 (captured and estimated before anything is timed)
    rounds: list[tuple[float, list[list]]] = []  # per round: the prefix sweep's seconds, its kernel spans
    full_forward: list[float] = []
    for _ in range(repeats):  # the two sides take turns, so load that drifts falls on both alike
        spans: list[list] = []
        with kernel_clock(model, spans):
            start = time.process_time()
            session.sweep(swept)
            rounds.append((time.process_time() - start, spans))
        start = time.process_time()
        for site in sites(session.model.controller_layers):
            for condition in swept:
                session.nll(condition, site.controllers)
        session.nll(REFERENCE)  # the sweep's reference, which it checks against the live run
        full_forward.append(time.process_time() - start)
    seconds = {"prefix": min(rounds)[0], "full_forward": min(full_forward)}
    sweep_seconds, spans = min(rounds)  # the fastest round, with the kernel times measured in it
    replays = [(layers, head) for kind, layers, head in spans if kind == "replay"]
    prefix_passes = [(layers, head) for kind, layers, head in spans if kind == "prefix"]
    assert len(replays) == cache.num_layers * len(swept) * len(list(cache.shard_indices()))
    limit = sum(layers + head for layers, head in replays)
    with_prefix = limit + sum(layers + head for layers, head in prefix_passes)
    return {
        "checkpoint": checkpoint,
        "arch": model.arch,
        "sweep_mode": sweep_mode(model),
        "separate_lm_head": bool(model.separate_lm_head),  # the sweep runs the head with the NLL (head_nll)
        "windows": len(windows),
        "window": windows.shape[1],
        "controllers": cache.num_layers,
        "decoder_layers": len(model.blocks),
        "conditions": swept,
        "resume_layers": [model.resume_layer(i) for i in range(cache.num_layers)],
        "sweep_seconds": seconds,
        "prefix_round_seconds": [round_seconds for round_seconds, _ in rounds],
        "limit_seconds": limit,
        "limit_with_prefix_pass_seconds": with_prefix,
        "replays": len(replays),
        "replay_layer_seconds": sum(layers for layers, _ in replays),
        "replay_head_nll_seconds": sum(head for _, head in replays),
        "prefix_over_limit": sweep_seconds / limit,
        "prefix_over_limit_with_prefix_pass": sweep_seconds / with_prefix,
        "prefix_over_full_forward": seconds["prefix"] / seconds["full_forward"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/moe-s0")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the sides taking turns; the fastest counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = bench(args.checkpoint, args.windows, args.batch_size, args.repeats, Path(tmp))
    r = {"batch_size": args.batch_size, "repeats": args.repeats, "threads": torch.get_num_threads(), **result}
    write_results("bench_sweep_transformers", r, markdown(r))


def markdown(r: dict) -> str:
    s = r["sweep_seconds"]
    rounds = ", ".join(f"{t:.1f}" for t in r["prefix_round_seconds"])
    lines = [
        f"# Per-layer sweep of a transformers model on prefix reuse, against its limit (batch {r['batch_size']}, "
        f"{r['threads']} thread, CPU seconds, fastest of {r['repeats']} rounds taken in turns)",
        "",
        "| checkpoint | controllers x conditions | sweep mode | prefix / limit | prefix / limit with the prefix "
        "passes | prefix / full forwards |",
        "|---|---|---|---|---|---|",
        f"| {Path(r['checkpoint']).name} ({r['windows']} windows x {r['window']}) | {r['controllers']} x "
        f"{len(r['conditions'])} | {r['sweep_mode']} | {r['prefix_over_limit']:.3f} | "
        f"{r['prefix_over_limit_with_prefix_pass']:.3f} | {r['prefix_over_full_forward']:.3f} |",
        "",
        f"Seconds: sweep prefix {s['prefix']:.1f} (rounds: {rounds}), full forwards {s['full_forward']:.1f}; limit "
        f"{r['limit_seconds']:.1f} ({r['replays']} replays: layers from the resume layer + final norm "
        f"{r['replay_layer_seconds']:.1f}, head + NLL {r['replay_head_nll_seconds']:.1f}), with the prefix passes "
        f"{r['limit_with_prefix_pass_seconds']:.1f}. Resume layers {r['resume_layers']} of {r['decoder_layers']} "
        f"decoder layers. Conditions: {', '.join(r['conditions'])}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
