"""The router-design study (issue 38): which mixture-of-experts router designs make routing static?

    OMP_NUM_THREADS=1 python benchmarks/router_design.py [--work /tmp/router_design]
        [--out data/router_design] [--shard K/N] [--list | --table]

Every variant is ``fca train --hf-config WORK/configs/<variant>.json --seed S --steps 300`` plus its flags: the
shipped MoE's config (``data/configs/moe-mixtral-tiny.json``, the recipe of ``data/checkpoints/moe-s0``) with
the variant's fields changed (``VARIANTS``: experts, top-k, load-balancing weight, a shared expert, width ×
depth), or the router-design flags of ``fca train`` (router z-loss, detached router input). Each finished run
is audited (``fca audit`` on 64 evenly spread windows of each split, with the per-layer sweep, which for a
router includes ``layer_mean_topk``) and exported with the audit's ``layer_mean_topk`` profile (``fca export``:
each layer's k static experts folded in, the router gone), whose eval NLL is measured on the 64 eval windows of
the model card's own eval NLL. All three run through ``fca_workbench.cli.main``, so each run is exactly the
commands its summary records. Runs go seed 0 of every variant first, then seeds 1 and 2.

Weights, configs, audits and exports stay in ``--work``; ``--out/<run>/`` gets ``train_log.csv``,
``model_card.json`` and ``audit_summary.json`` (the audit's figures, the export's eval NLL, the commands, the
times). The plan, status, resuming and listing are the controller-design study's (``controller_design.py``).
"""

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))  # controller_design, beside this script

from controller_design import listing, status

from fca_workbench.cli import main as fca
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE, TRAIN_LOG_FILE
from fca_workbench.foundation.files import read_json, write_atomic, write_json
from fca_workbench.results.conditions import LAYER_MEAN_TOPK
from fca_workbench.results.design_study import ROUTER_STUDY, design_seed_table, read_design_study
from fca_workbench.results.layout import AUDIT_FILE, STUDY_SUMMARY_FILE
from fca_workbench.results.tabular import to_markdown
from fca_workbench.training.train import coefficient_summary

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "data" / "configs" / "moe-mixtral-tiny.json"
SUMMARY_FILE = STUDY_SUMMARY_FILE  # what fca_workbench.results.design_study reads
STEPS = 300
SEEDS = (0, 1, 2)
WINDOWS = 64  # audited eval and calibration windows, as many as the model card's eval windows
EXPORT_FILE = "export_eval.json"  # in the export folder: its eval NLL, once measured

# GraniteMoeShared is the transformers MoE whose shared expert has no gate of its own; with its multipliers at 1,
# its attention scaled by 1/sqrt(head_dim) and Mixtral's norm epsilon and rope theta, it is the shipped Mixtral
# plus an always-on expert of one routed expert's width (its router's softmax over the top-k logits equals
# Mixtral's renormalised top-k of the softmax)
GRANITE_AS_MIXTRAL = {
    "model_type": "granitemoeshared",
    "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0,
    "logits_scaling": 1.0,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
}


@dataclass(frozen=True)
class Variant:
    """The config fields a variant changes in the shipped MoE's config, and the ``fca train`` flags it adds."""

    fields: tuple[tuple[str, object], ...] = ()
    flags: tuple[str, ...] = ()
    about: str = ""


def fields(**changed: object) -> tuple[tuple[str, object], ...]:
    return tuple(changed.items())


VARIANTS: dict[str, Variant] = {
    "default": Variant(about="the shipped MoE: 8 experts, top-2, load-balancing weight 0.01"),
    "experts-4": Variant(fields(num_local_experts=4), about="4 experts"),
    "experts-16": Variant(fields(num_local_experts=16), about="16 experts"),
    "topk-1": Variant(fields(num_experts_per_tok=1), about="top-1 routing"),
    "topk-4": Variant(fields(num_experts_per_tok=4), about="top-4 routing"),
    "lb-0": Variant(fields(router_aux_loss_coef=0.0), about="no load-balancing loss"),
    "lb-0.1": Variant(fields(router_aux_loss_coef=0.1), about="10x the load-balancing weight"),
    "zloss-1e-3": Variant(flags=("--router-z-loss", "1e-3"), about="router z-loss, weight 1e-3"),
    "input-detached": Variant(flags=("--router-input", "detached"), about="the router's input without its gradient"),
    "shared-on": Variant(
        fields(**GRANITE_AS_MIXTRAL, shared_intermediate_size=160),
        about="GraniteMoeShared with an ungated shared expert",
    ),
    "wide-128x6": Variant(
        fields(hidden_size=128, num_hidden_layers=6, intermediate_size=224), about="one step up in width x depth"
    ),
    "shared-off": Variant(
        fields(**GRANITE_AS_MIXTRAL, shared_intermediate_size=0),
        about="GraniteMoeShared without it: the family control",
    ),
}


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int
    steps: int = STEPS
    train_extra: tuple[str, ...] = ()  # flags the study does not vary (tests shrink the run with them)
    audit_extra: tuple[str, ...] = ("--max-windows", str(WINDOWS), "--latency-repeats", "1")
    base: Path = BASE_CONFIG  # tests shrink the model with a smaller base config

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"

    def config_path(self, work: Path) -> Path:
        return work / "configs" / f"{self.variant}.json"

    def config(self) -> dict:
        base = read_json(self.base)
        assert isinstance(base, dict)  # read_json's default expect
        config: dict[str, Any] = {**base, **dict(VARIANTS[self.variant].fields)}
        if config["model_type"] == GRANITE_AS_MIXTRAL["model_type"]:  # Mixtral's attention scale, 1/sqrt(head_dim)
            config["attention_multiplier"] = (config["hidden_size"] // config["num_attention_heads"]) ** -0.5
        return config

    def train_args(self, work: Path) -> list[str]:
        flags = ["--seed", str(self.seed), "--steps", str(self.steps), *self.train_extra, *VARIANTS[self.variant].flags]
        return ["train", "--hf-config", str(self.config_path(work)), *flags, "--out", str(work / self.name)]

    def audit_args(self, work: Path) -> list[str]:
        return [
            "audit",
            str(work / self.name),
            *self.audit_extra,
            "--per-layer",
            "--out",
            str(work / f"{self.name}-audit"),
        ]

    def export_args(self, work: Path) -> list[str]:
        return [
            "export",
            str(work / self.name),
            "--profile",
            LAYER_MEAN_TOPK,
            "--audit",
            str(work / f"{self.name}-audit"),
            "--out",
            str(work / f"{self.name}-export"),
        ]


def plan(
    seeds: Sequence[int] = SEEDS, variants: Sequence[str] = tuple(VARIANTS), steps: int = STEPS, **extra: object
) -> list[Run]:
    """Seed 0 of every variant first, then the next seed: a partial study still covers every axis."""
    return [Run(v, s, steps, **extra) for s in seeds for v in variants]  # type: ignore[arg-type]


def export_eval_nll(run: Run, work: Path) -> float:
    """The export's NLL on the eval windows the model card's eval NLL is over (``fca train``'s computation)."""
    folder = work / f"{run.name}-export"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = load_tokenizer(folder)
    card = read_json(work / run.name / TRAIN_CARD_FILE)
    assert isinstance(card, dict)
    settings = card["settings"]
    windows = load_windows(split_path("eval"), tokenizer, settings["window"], settings["eval_windows"])
    nll, _ = coefficient_summary(model, windows, with_coefficients=False)
    return round(nll, 4)


def summary(run: Run, card: dict, audit: dict, export: dict, seconds: dict) -> dict:
    """What the study keeps of one run: its commands, cost, eval NLL, the export's eval NLL and the audit's
    figures as audit.json has them (so ``results.seeds.summarise`` reads a list of summaries as it reads
    audits). ``seconds``: each step's time, None for a step an earlier invocation ran."""
    return {
        "run": run.name,
        "variant": run.variant,
        "seed": run.seed,
        "commands": {
            step: "fca " + " ".join(args(Path("WORK")))
            for step, args in (("train", run.train_args), ("audit", run.audit_args), ("export", run.export_args))
        },
        "train_seconds": card["train_seconds"],
        "audit_seconds": seconds.get("audit"),
        "export_seconds": seconds.get("export"),
        "eval_nll": card["eval_nll"],
        "export_eval_nll": export["eval_nll"],
        "params": card["params"],
        "model": {k: v for k, v in audit["model"].items() if k != "path"},
        "data": audit["data"],
        "settings": {k: v for k, v in audit["settings"].items() if k not in ("checkpoint", "cache")},
        **{k: audit[k] for k in ("conditions", "retention", "variance", "variation", "execution", "per_layer")},
        "verdict": audit["verdict"],
    }


def timed(seconds: dict, step: str, argv: list[str]) -> bool:
    started = time.perf_counter()
    ok = fca(argv) == 0
    seconds[step] = round(time.perf_counter() - started, 1)
    return ok


def run_one(run: Run, work: Path, out: Path) -> bool:
    """Train (or resume), audit, export and summarise one run; False when fca refused a step (its message is
    printed)."""
    checkpoint, audit_dir, export_dir = (work / f"{run.name}{tail}" for tail in ("", "-audit", "-export"))
    config = run.config_path(work)
    if not config.is_file() or read_json(config) != run.config():
        config.parent.mkdir(parents=True, exist_ok=True)
        write_json(config, run.config())
    seconds: dict = {}
    if not (checkpoint / TRAIN_CARD_FILE).is_file() and fca(run.train_args(work)) != 0:
        return False
    if not (audit_dir / AUDIT_FILE).is_file() and not timed(seconds, "audit", run.audit_args(work)):
        return False
    if not (export_dir / EXPORT_FILE).is_file():
        if not (export_dir / "config.json").is_file() and not timed(seconds, "export", run.export_args(work)):
            return False
        write_json(export_dir / EXPORT_FILE, {"eval_nll": export_eval_nll(run, work)})
    card, audit, export = (
        read_json(p) for p in (checkpoint / TRAIN_CARD_FILE, audit_dir / AUDIT_FILE, export_dir / EXPORT_FILE)
    )
    assert isinstance(card, dict) and isinstance(audit, dict) and isinstance(export, dict)  # read_json's default
    folder = out / run.name
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / TRAIN_LOG_FILE, (checkpoint / TRAIN_LOG_FILE).read_bytes())
    write_json(folder / TRAIN_CARD_FILE, card)
    write_json(folder / SUMMARY_FILE, summary(run, card, audit, export, seconds))
    return True


def study(runs: list[Run], work: Path, out: Path) -> list[str]:
    """Every run not done yet, in order; returns the names of those fca refused."""
    failed = []
    for run in runs:
        state = status(run, work, out)  # type: ignore[arg-type]  # any run of this shape
        if state == "done":
            continue
        print(f"== {run.name}: {state}", flush=True)
        if not run_one(run, work, out):
            failed.append(run.name)
    return failed


def findings_table(out: Path) -> str:
    """Every variant's figures as mean ± sd over its seeds, in the Markdown every workbench table is written in."""
    found = read_design_study(out, ROUTER_STUDY)
    skipped = [f"left out: {line}" for line in found.skipped]
    return "\n".join([to_markdown(design_seed_table(found.runs, ROUTER_STUDY)), *skipped])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/router_design"), help="weights, audits, exports")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "router_design", help="the summaries")
    parser.add_argument("--list", action="store_true", help="print the plan and what is done, then stop")
    parser.add_argument("--table", action="store_true", help="print the committed summaries as Markdown, then stop")
    parser.add_argument(
        "--shard",
        type=shard,
        default=(0, 1),
        metavar="K/N",
        help="run only every N-th run of the plan from the K-th (0-based), so N processes can share --work",
    )
    return parser.parse_args(argv)


def shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}")
    return int(index), int(count)


if __name__ == "__main__":
    args = parse_args()
    index, count = args.shard
    runs = plan()[index::count]
    if args.table:
        print(findings_table(args.out))
    elif args.list:
        print(listing(runs, args.work, args.out))  # type: ignore[arg-type]  # listing reads any run of this shape
    else:
        failed = study(runs, args.work, args.out)
        print(listing(runs, args.work, args.out))  # type: ignore[arg-type]
        if failed:
            raise SystemExit(f"fca refused {len(failed)} runs: {', '.join(failed)}")
