"""The workbench against the same work written by hand with nnsight, side by side in one run (ratios only:
absolute times are noise on a shared machine).

    .venv/bin/pip install -e '.[bench]'        # nnsight, for this benchmark only
    .venv/bin/python benchmarks/bench_vs_nnsight.py [--checkpoint data/checkpoints/featuregate-s0]
        [--windows 32] [--batch-size 16] [--repeats 2]

Each group of sides takes turns, ``--repeats`` rounds, the fastest round of each side counting. On the
same evenly sampled eval and calibration windows (FeatureGate: its controllers are modules whose
output is the whole coefficient, so nnsight can capture and replace them):

- **full audit** (capture eval and calibration, static profiles, frozen replay of every condition): the
  workbench's replay session as users run it (``ReplaySession``: ``cache``, ``profiles``, ``nll``), the model
  fingerprint taken once from the memo in the cache root (``audit.fingerprint_memo``: hashed in the first
  round, remembered after) against nnsight (``.output.save()`` on every controller to capture, the profiles
  written out, ``.skip(value)`` on every controller to replay), goal <= 1.0. The workbench's capture
  and replays need each token's NLL only, so they run the head and the softmax a chunk of rows at a time
  (``audit.forward.forward_nll``); the nnsight side takes the whole logits its trace gives
  (``.output.logits.save()``), as the plain forward + NLL does;
- **per-layer sweep** (every condition at each layer alone): the session's sweep (``ReplaySession.sweep``,
  prefix reuse) against its L x K full frozen replays (``ReplaySession.nll`` at each layer, the workbench's
  fallback) and against nnsight doing the same L x K forwards
  with every controller skipped. The issue's prefix-reuse limit is (L+1)/(2L) of the naive cost plus one
  prefix pass per batch (1/(L K)), goal within 1.1x of it; it counts the blocks only. The limit measured here
  (``bench_sweep.sweep_limit``, same run) also counts the head + NLL that every resumed replay must still run;
- **capture / (plain forward + NLL)**, goal <= 1.10, with cProfile's account of where capture's time goes;
- both sides' NLLs agree (largest difference of any condition's and any per-layer row's mean NLL).

Writes benchmarks/results/bench_vs_nnsight.json and .md.
"""

import argparse
import cProfile
import pstats
import tempfile
from pathlib import Path

import torch
from bench_session import handed_in
from bench_sweep import sweep_limit
from results_file import write_results
from timing import best_of_each

from fca_workbench.adapters.sites import sites
from fca_workbench.audit.capture import model_fingerprint
from fca_workbench.audit.fingerprint_memo import checkpoint_identity, remembered_fingerprint
from fca_workbench.audit.inputs import EVAL
from fca_workbench.audit.interventions import (
    broadcast_profile,
    derangement,
    position_permutations,
    restrict_to,
    shuffle_positions,
)
from fca_workbench.audit.session import LOADING_SETTINGS, ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.models import load_model, next_token_nll
from fca_workbench.results.conditions import CONDITIONS, REFERENCE, STATIC_PROFILES

FROZEN = [c for c in CONDITIONS if c != "unperturbed"]  # replayed with the controllers skipped
SWEPT = [c for c in FROZEN if c != "correct"]


# ---- the workbench -------------------------------------------------------------------------------------


def workbench_audit(model, windows, calib, batch_size, folder: Path, fingerprint) -> tuple[ReplaySession, dict]:
    """As an audit of the checkpoint runs it: the model fingerprint taken once (``fingerprint()``: from the
    memo in the cache root after the checkpoint's first audit), then the session's captures, profiles and
    replays."""
    session = handed_in(model, windows, calib, folder, batch_size, fingerprint=fingerprint())
    session.capture_all()
    return session, {c: session.nll(c).double().mean().item() for c in FROZEN}


def workbench_full_forwards(session: ReplaySession) -> None:
    """The sweep without prefix reuse: every condition replayed at each layer alone, then the reference."""
    for site in sites(session.model.controller_layers):
        for condition in SWEPT:
            session.nll(condition, site.controllers)
    session.nll(REFERENCE)


# ---- the same work by hand with nnsight -----------------------------------------------------------------


def controller_envoys(traced, model):
    """The nnsight envoys of the model's controllers, found by their module paths."""
    names = {id(module): name for name, module in model.named_modules()}
    envoys = []
    for controller in model.controllers:
        envoy = traced
        for part in names[id(controller)].split("."):
            envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
        envoys.append(envoy)
    return envoys


@torch.no_grad()
def nnsight_capture(traced, model, windows, batch_size):
    """Every controller's output (``.output.save()``) and the per-token NLL, batch by batch, in memory."""
    layers, nll = [], []
    for batch in windows.split(batch_size):
        with traced.trace(batch):
            saved = list().save()  # type: ignore[attr-defined]  # nnsight mounts .save() on every object
            for envoy in controller_envoys(traced, model):
                saved.append(envoy.output)
            logits = traced.output.logits.save()
        layers.append([c.float() for c in saved])
        nll.append(next_token_nll(logits, batch))
    return [torch.cat(per_layer) for per_layer in zip(*layers)], torch.cat(nll)


@torch.no_grad()
def nnsight_replay(traced, model, batch, coefficients):
    """Per-token NLL with every controller skipped (``.skip(value)``) and given ``coefficients``."""
    with traced.trace(batch):
        for envoy, value in zip(controller_envoys(traced, model), coefficients):
            envoy.skip(value)
        logits = traced.output.logits.save()
    return next_token_nll(logits, batch)


def nnsight_condition(condition, coefficients, profiles, indices, seed=0):
    """The coefficients ``condition`` assigns to windows ``indices`` (the pure functions of interventions.py)."""
    correct = [c[indices] for c in coefficients]
    if condition == "correct":
        return correct
    if condition == "cross_input":
        donors = derangement(len(coefficients[0]), seed)
        return [c[donors[indices]] for c in coefficients]
    if condition == "token_shuffle":
        return shuffle_positions(correct, position_permutations(indices, correct[0].shape[1], seed))
    assert condition in STATIC_PROFILES
    slots = [tuple(c.shape[2:]) for c in coefficients]
    return broadcast_profile(profiles[condition], slots, len(indices), correct[0].shape[1])


def nnsight_profiles(coefficients: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Section 4's static profiles, written out over the calibration coefficients held in memory."""
    position_mean = [c.double().mean(dim=0) for c in coefficients]
    global_mean = sum(p.sum() for p in position_mean) / sum(p.numel() for p in position_mean)
    return {
        "global_mean": [torch.as_tensor(global_mean).float() for _ in position_mean],
        "layer_scalar": [p.mean().float() for p in position_mean],
        "layer_mean": [p.mean(dim=0).float() for p in position_mean],
        "layer_position_mean": [p.float() for p in position_mean],
    }


def nnsight_audit(traced, model, windows, calib, batch_size):
    coefficients, _ = nnsight_capture(traced, model, windows, batch_size)
    calib_coefficients, _ = nnsight_capture(traced, model, calib, batch_size)
    profiles = nnsight_profiles(calib_coefficients)
    nll = {}
    for condition in FROZEN:
        rows = [
            nnsight_replay(traced, model, windows[i], nnsight_condition(condition, coefficients, profiles, i))
            for i in torch.arange(len(windows)).split(batch_size)
        ]
        nll[condition] = torch.cat(rows).double().mean().item()
    return coefficients, profiles, nll


def nnsight_sweep(traced, model, windows, coefficients, profiles, batch_size):
    """Mean NLL of every (layer, condition): L x K full forwards, every controller frozen."""
    sums: dict[tuple[int, str], float] = {}
    for i in torch.arange(len(windows)).split(batch_size):
        correct = nnsight_condition("correct", coefficients, profiles, i)
        for condition in SWEPT:
            intervened = nnsight_condition(condition, coefficients, profiles, i)
            for layer in range(len(coefficients)):
                nll = nnsight_replay(traced, model, windows[i], restrict_to(intervened, correct, [layer]))
                sums[(layer, condition)] = sums.get((layer, condition), 0.0) + nll.double().sum().item()
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    return {key: total / tokens for key, total in sums.items()}


# ---- capture against a plain forward -------------------------------------------------------------------


@torch.no_grad()
def forward_and_nll(model, windows, batch_size):
    for batch in windows.split(batch_size):
        next_token_nll(model(batch).logits, batch)


def capture_profile(model, windows, batch_size, folder: Path) -> list[tuple[str, float]]:
    """cProfile's cumulative seconds of the session's capture's parts, largest first."""
    session = handed_in(model, windows, cache_root=folder, batch_size=batch_size)
    profiler = cProfile.Profile()
    profiler.runcall(session.cache, EVAL)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # undocumented, so absent from typeshed
    parts = {
        "model_fingerprint": "model fingerprint (sha256 of every weight)",
        "fingerprint_tensor": "fingerprints (weights and windows)",
        "_call_impl": "model forward",
        "next_token_nll": "NLL",
        "save": "shard serialisation (safetensors)",
        "write_atomic": "shard and manifest writes",
        "read_manifest": "manifest read back (jsonschema)",
        "library_versions": "library versions",
        "capture": "capture, total",
    }
    found: dict[str, float] = {}
    for (_, _, name), (_, _, _, cumulative, _) in stats.items():
        if name in parts:
            found[parts[name]] = max(found.get(parts[name], 0.0), cumulative)
    return sorted(found.items(), key=lambda kv: -kv[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="data/checkpoints/featuregate-s0")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the sides taking turns; the fastest counts")
    args = parser.parse_args()
    from nnsight import NNsight

    model = load_model(args.checkpoint).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    windows = load_windows(split_path("eval"), tokenizer, 256, args.windows)
    calib = load_windows(split_path("calibration"), tokenizer, 256, args.windows)
    traced = NNsight(model)
    identity = checkpoint_identity(
        Path(args.checkpoint), {k: getattr(AuditSettings(args.checkpoint), k) for k in LOADING_SETTINGS}
    )
    # None: weights too small to be worth remembering (``fingerprint_memo.MEMO_MIN_BYTES``), hashed as a session hashes them
    layers, conditions = len(model.controllers), len(SWEPT)
    forward_and_nll(model, windows[: args.batch_size], args.batch_size)  # warm-up, both sides
    nnsight_capture(traced, model, windows[: args.batch_size], args.batch_size)
    r = {
        "checkpoint": args.checkpoint,
        "windows": len(windows),
        "window": windows.shape[1],
        "layers": layers,
        "conditions": conditions,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        runs = iter(range(10**6))
        seconds, _ = best_of_each(
            args.repeats,
            {
                "forward": lambda: forward_and_nll(model, windows, args.batch_size),
                "capture": lambda: handed_in(
                    model, windows, cache_root=tmp / f"c{next(runs)}", batch_size=args.batch_size
                ).cache(EVAL),
            },
        )
        r["capture_profile_seconds"] = capture_profile(model, windows, args.batch_size, tmp / "profiled")
        audits, audited = best_of_each(
            args.repeats,
            {
                "workbench": lambda: workbench_audit(
                    model,
                    windows,
                    calib,
                    args.batch_size,
                    tmp / f"a{next(runs)}",
                    lambda: remembered_fingerprint(tmp, identity, lambda: model_fingerprint(model)),
                ),
                "nnsight": lambda: nnsight_audit(traced, model, windows, calib, args.batch_size),
            },
        )
        (session, nll_wb), (coefficients, nn_profiles, nll_nn) = audited["workbench"], audited["nnsight"]
        sweeps, swept = best_of_each(
            args.repeats,
            {
                "prefix": lambda: session.sweep(SWEPT),
                "full_forward": lambda: workbench_full_forwards(session),
                "nnsight": lambda: nnsight_sweep(traced, model, windows, coefficients, nn_profiles, args.batch_size),
            },
        )
        (nll_sweep_wb, _), nll_sweep_nn = swept["prefix"], swept["nnsight"]
        indices = next(session.eval_cache.shard_indices())
        limit = sweep_limit(model, windows[indices], session.coefficients(REFERENCE, indices), conditions)
    prefix = sweeps["prefix"]
    r.update(
        {
            "plain_forward_and_nll_seconds": seconds["forward"],
            "capture_over_forward_and_nll": seconds["capture"] / seconds["forward"],
            "full_audit_workbench_over_nnsight": audits["workbench"] / audits["nnsight"],
            "full_audit_seconds": audits,
            "sweep_seconds": sweeps,
            "sweep_prefix_over_full_forward": prefix / sweeps["full_forward"],
            "sweep_prefix_over_nnsight": prefix / sweeps["nnsight"],
            "sweep_full_forward_over_nnsight": sweeps["full_forward"] / sweeps["nnsight"],
            "prefix_limit": (layers + 1) / (2 * layers) + 1 / (layers * conditions),
            "prefix_limit_with_head": limit["limit"],
            "sweep_prefix_over_limit_with_head": prefix / sweeps["full_forward"] / limit["limit"],
            "head_share_logits": limit["head_share_logits"],
            "head_share_fused": limit["head_share_fused"],
            "limit_kernel_seconds": limit["seconds"],
            "max_nll_difference_conditions": max(abs(nll_wb[c] - nll_nn[c]) for c in FROZEN),
            "max_nll_difference_per_layer": max(
                abs(nll.mean().item() - nll_sweep_nn[(site.layer, condition)])
                for (site, condition), nll in nll_sweep_wb.items()
            ),
        }
    )
    write_results("bench_vs_nnsight", r, markdown(r))


def markdown(r: dict) -> str:
    s = r["sweep_seconds"]
    lines = [
        f"# Workbench vs nnsight ({r['checkpoint']}, {r['windows']} windows x {r['window']}, batch {r['batch_size']}, "
        f"{r['threads']} thread, fastest of {r['repeats']} rounds taken in turns)",
        "",
        f"L = {r['layers']} layers, K = {r['conditions']} swept conditions. Both sides' NLLs agree: largest "
        f"difference {r['max_nll_difference_conditions']:.2e} nats over the conditions, "
        f"{r['max_nll_difference_per_layer']:.2e} over the per-layer rows.",
        "",
        "| ratio | measured | goal |",
        "|---|---|---|",
        f"| full audit (capture eval + calibration, profiles, every frozen condition): workbench / nnsight | "
        f"{r['full_audit_workbench_over_nnsight']:.3f} | <= 1.0 |",
        f"| per-layer sweep: prefix reuse / L x K full forwards | {r['sweep_prefix_over_full_forward']:.3f} | "
        f"<= 1.1 x {r['prefix_limit']:.3f} = {1.1 * r['prefix_limit']:.3f} ((L+1)/2L + 1/(LK), blocks only) |",
        f"| per-layer sweep: prefix limit counting the head + NLL (its kernels timed alone: head + NLL "
        f"{r['head_share_fused']:.1%} of a frozen forward + NLL as the audit runs both, head_nll; "
        f"{r['head_share_logits']:.1%} from whole logits) | {r['prefix_limit_with_head']:.3f} | (what prefix reuse "
        f"can reach on this model) |",
        f"| per-layer sweep: prefix reuse / that limit | {r['sweep_prefix_over_limit_with_head']:.3f} | <= 1.1 |",
        f"| per-layer sweep: workbench prefix reuse / nnsight (L x K forwards) | {r['sweep_prefix_over_nnsight']:.3f} | "
        f"<= {1.1 * r['prefix_limit']:.3f} |",
        f"| per-layer sweep: workbench full forwards / nnsight | {r['sweep_full_forward_over_nnsight']:.3f} | ~1 |",
        f"| capture / (plain forward + NLL) | {r['capture_over_forward_and_nll']:.3f} | <= 1.10 |",
        "",
        f"Seconds: full audit workbench {r['full_audit_seconds']['workbench']:.1f}, nnsight "
        f"{r['full_audit_seconds']['nnsight']:.1f}; sweep prefix {s['prefix']:.1f}, full forwards {s['full_forward']:.1f}, nnsight {s['nnsight']:.1f}; plain "
        f"forward + NLL {r['plain_forward_and_nll_seconds']:.2f}.",
        "",
        "Where capture's time goes (cProfile, cumulative seconds):",
        "",
    ]
    lines += [f"- {name}: {seconds:.3f} s" for name, seconds in r["capture_profile_seconds"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
