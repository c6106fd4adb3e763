"""The router-design study (issue 38): which mixture-of-experts router designs make routing static?

    OMP_NUM_THREADS=1 python studies/router_design.py [--work /tmp/router_design]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # design_runner, beside this script

from design_runner import keep, run_study, study_parser

from fca_workbench.cli import main as fca
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.foundation.checkpoint import TRAIN_CARD_FILE, TRAIN_LOG_FILE
from fca_workbench.foundation.files import read_json, write_atomic, write_json
from fca_workbench.results.conditions import LAYER_MEAN_TOPK
from fca_workbench.results.design_study import (
    design_findings,
    design_seed_table,
    read_design_study,
)
from fca_workbench.results.finetune_study import (
    LEAST_STATIC,
    MOST_STATIC,
    SHIPPED,
    finetune_runs_table,
    finetune_seed_table,
    read_finetunes,
)
from fca_workbench.results.layout import AUDIT_FILE, FINETUNE_FOLDER, FINETUNE_SUMMARY_FILE
from fca_workbench.results.study_kinds import ROUTER_STUDY
from fca_workbench.results.tabular import to_markdown
from fca_workbench.training.train import coefficient_summary
from fca_workbench.training.train_settings import TrainSettings

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "data" / "configs" / "moe-mixtral-tiny.json"
STEPS = 300
SEEDS = (0, 1, 2)
WINDOWS = 64  # audited eval and calibration windows, as many as the model card's eval windows
AUDIT_WINDOWS = ("--max-windows", str(WINDOWS), "--latency-repeats", "1")
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
    audit_extra: tuple[str, ...] = AUDIT_WINDOWS
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
        return audit_args(work / self.name, work / f"{self.name}-audit", self.audit_extra)

    def export_args(self, work: Path) -> list[str]:
        return export_args(work / self.name, work / f"{self.name}-audit", work / f"{self.name}-export")


def audit_args(checkpoint: Path, audit: Path, extra: Sequence[str]) -> list[str]:
    """The study's audit of a checkpoint: ``extra`` (its windows), with the per-layer sweep."""
    return ["audit", str(checkpoint), *extra, "--per-layer", "--out", str(audit)]


def export_args(checkpoint: Path, audit: Path, export: Path) -> list[str]:
    """The static top-k export of a checkpoint with its audit's ``layer_mean_topk`` profile."""
    return ["export", str(checkpoint), "--profile", LAYER_MEAN_TOPK, "--audit", str(audit), "--out", str(export)]


def plan(
    seeds: Sequence[int] = SEEDS, variants: Sequence[str] = tuple(VARIANTS), steps: int = STEPS, **extra: object
) -> list[Run]:
    """Seed 0 of every variant first, then the next seed: a partial study still covers every axis."""
    return [Run(v, s, steps, **extra) for s in seeds for v in variants]  # type: ignore[arg-type]


def card_windows_nll(folder: Path, checkpoint: Path) -> float:
    """The NLL of the model in ``folder`` (an export, a fine-tune) on the eval windows ``checkpoint``'s model card's
    eval NLL is over (``fca train``'s computation)."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = load_tokenizer(folder)
    settings = read_card(checkpoint)["settings"]
    windows = load_windows(split_path("eval"), tokenizer, settings["window"], settings["eval_windows"])
    nll, _ = coefficient_summary(model, windows, with_coefficients=False)
    return round(nll, 4)


def read_card(checkpoint: Path) -> dict:
    card = read_json(checkpoint / TRAIN_CARD_FILE)
    assert isinstance(card, dict)  # read_json's default expect
    return card


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
        write_json(export_dir / EXPORT_FILE, {"eval_nll": card_windows_nll(export_dir, checkpoint)})
    card, audit, export = (
        read_json(p) for p in (checkpoint / TRAIN_CARD_FILE, audit_dir / AUDIT_FILE, export_dir / EXPORT_FILE)
    )
    assert isinstance(card, dict) and isinstance(audit, dict) and isinstance(export, dict)  # read_json's default
    keep(out, run.name, checkpoint, card, summary(run, card, audit, export, seconds))
    return True


def findings_table(out: Path) -> str:
    """Every variant's figures as mean ± sd over its seeds, in the Markdown every workbench table is written in."""
    found = read_design_study(out, ROUTER_STUDY)
    skipped = [f"left out: {line}" for line in found.skipped]
    tables = [to_markdown(table(found.runs, ROUTER_STUDY)) for table in (design_seed_table, design_findings)]
    return "\n".join([*tables, *skipped])


# The fine-tune stage (issue 38, "can the router be dropped?"): each static top-k export fine-tuned for a tenth of
# the study's steps, its zero routers frozen, so the model it ends as still has no router.
FINETUNE_STEPS = STEPS // 10
FINETUNE_WARMUP = TrainSettings.warmup * FINETUNE_STEPS // STEPS  # the study's schedule, scaled: warm-up 1/6
SHIPPED_MOE = ROOT / "data" / "checkpoints" / "moe-s0"
CHOICE_FILE = "choice.json"  # in --out/finetune: the most and least static designs, and the fine-tunes left out
FINDINGS_FILE = "findings.md"


@dataclass(frozen=True)
class FineTune:
    """One fine-tune of the static top-k export of ``checkpoint`` (the model ``source`` names; its audit and
    export are ``audit`` and ``export``): ``fca train --init`` of the export, routers frozen, ``seed``."""

    role: str  # SHIPPED, MOST_STATIC or LEAST_STATIC
    source: str
    variant: str | None  # the study's variant; None for the shipped MoE
    seed: int
    checkpoint: Path
    audit: Path
    export: Path
    steps: int = FINETUNE_STEPS
    warmup: int = FINETUNE_WARMUP
    train_extra: tuple[str, ...] = ()
    audit_extra: tuple[str, ...] = AUDIT_WINDOWS  # the shipped MoE's own audit, as the study audits its runs

    @property
    def name(self) -> str:
        return f"{self.source}-ft{self.seed}"

    @property
    def control(self) -> str:
        """The folder name of the control: the source model itself, router and all, fine-tuned alike."""
        return f"{self.name}-model"

    def train_args(self, finetunes: Path) -> list[str]:
        return self.tune_args(self.export, ("--freeze-routers",), finetunes / self.name)

    def control_args(self, finetunes: Path) -> list[str]:
        return self.tune_args(self.checkpoint, (), finetunes / self.control)

    def tune_args(self, init: Path, flags: tuple[str, ...], out: Path) -> list[str]:
        schedule = ("--seed", str(self.seed), "--steps", str(self.steps), "--warmup", str(self.warmup))
        return ["train", "--init", str(init), *flags, *schedule, *self.train_extra, "--out", str(out)]


def static_extremes(out: Path) -> dict:
    """The variants of the highest and lowest mean ``layer_mean_topk`` retention over the study's summaries."""
    table = design_seed_table(read_design_study(out, ROUTER_STUDY).runs, ROUTER_STUDY)
    ranked = table.sort_values("retention_layer_mean_topk_mean").to_dict("records")

    kept = ("variant", "retention_layer_mean_topk_mean", "seeds")
    return {MOST_STATIC: {k: ranked[-1][k] for k in kept}, LEAST_STATIC: {k: ranked[0][k] for k in kept}}


def finetune_plan(
    work: Path, finetunes: Path, out: Path, seeds: Sequence[int] = SEEDS, shipped: Path = SHIPPED_MOE, **extra: Any
) -> tuple[list[FineTune], dict]:
    """The shipped MoE's export fine-tuned with each seed (audited and exported into ``finetunes``), then each
    seed of the most and the least static design whose export ``work`` holds; and the choice, with a line for
    each seed left out."""
    choice: dict[str, Any] = {**static_extremes(out), "left_out": []}
    audit, export = (finetunes / f"{shipped.name}{tail}" for tail in ("-audit", "-export"))
    tunes = [FineTune(SHIPPED, shipped.name, None, s, shipped, audit, export, **extra) for s in seeds]
    for role in (MOST_STATIC, LEAST_STATIC):
        variant = choice[role]["variant"]
        for seed in seeds:
            run = f"{variant}-s{seed}"
            if not ((work / f"{run}-export" / EXPORT_FILE).is_file() and (work / run / TRAIN_CARD_FILE).is_file()):
                choice["left_out"].append(f"{run} ({role}): not yet trained, audited and exported in {work}")
                continue
            checkpoint, audit, export = (work / f"{run}{tail}" for tail in ("", "-audit", "-export"))
            tunes.append(FineTune(role, run, variant, seed, checkpoint, audit, export, **extra))
    return tunes, choice


def finetune_one(tune: FineTune, finetunes: Path, out: Path) -> bool:
    """Audit and export the source where that is not done (the shipped MoE), fine-tune its export and, as the
    control, the source itself (its router training), measure both on the source's eval windows and summarise;
    False when fca refused a step."""
    seconds: dict = {}
    if not (tune.audit / AUDIT_FILE).is_file():
        if not timed(seconds, "audit", audit_args(tune.checkpoint, tune.audit, tune.audit_extra)):
            return False
    if not (tune.export / EXPORT_FILE).is_file():
        if not (tune.export / "config.json").is_file():
            if not timed(seconds, "export", export_args(tune.checkpoint, tune.audit, tune.export)):
                return False
        write_json(tune.export / EXPORT_FILE, {"eval_nll": card_windows_nll(tune.export, tune.checkpoint)})
    folder, control = finetunes / tune.name, finetunes / tune.control
    if not (folder / TRAIN_CARD_FILE).is_file() and fca(tune.train_args(finetunes)) != 0:
        return False
    if not (control / TRAIN_CARD_FILE).is_file() and fca(tune.control_args(finetunes)) != 0:
        return False
    source, audit, export = (
        read_json(p) for p in (tune.checkpoint / TRAIN_CARD_FILE, tune.audit / AUDIT_FILE, tune.export / EXPORT_FILE)
    )
    assert isinstance(source, dict) and isinstance(audit, dict) and isinstance(export, dict)  # read_json's default
    model_nll, export_nll = source["eval_nll"], export["eval_nll"]
    tuned = card_windows_nll(folder, tune.checkpoint)
    shown = {str(tune.checkpoint.parent): "WORK", str(tune.export.parent): "WORK", str(finetunes): "FINETUNE"}
    summary = {
        "run": tune.name,
        "role": tune.role,
        "source": tune.source,
        "variant": tune.variant,
        "seed": tune.seed,
        "steps": tune.steps,
        "warmup": tune.warmup,
        "command": "fca " + " ".join(relabel(arg, shown) for arg in tune.train_args(finetunes)),
        "control_command": "fca " + " ".join(relabel(arg, shown) for arg in tune.control_args(finetunes)),
        "train_seconds": read_card(folder)["train_seconds"],
        "audit_seconds": seconds.get("audit"),
        "export_seconds": seconds.get("export"),
        "eval_fingerprint": source["eval_fingerprint"],
        "retention_layer_mean_topk": audit["retention"][LAYER_MEAN_TOPK]["value"],
        "model_eval_nll": model_nll,
        "export_eval_nll": export_nll,
        "finetuned_eval_nll": tuned,
        "recovered": round((export_nll - tuned) / (export_nll - model_nll), 4),
        "model_finetuned_eval_nll": card_windows_nll(control, tune.checkpoint),
    }
    kept = out / FINETUNE_FOLDER / tune.name
    kept.mkdir(parents=True, exist_ok=True)
    write_atomic(kept / TRAIN_LOG_FILE, (folder / TRAIN_LOG_FILE).read_bytes())
    write_json(kept / FINETUNE_SUMMARY_FILE, summary)
    return True


def relabel(arg: str, shown: dict[str, str]) -> str:
    """A command's path argument with the folder it lies in named as the study's docs name it."""
    for folder, label in shown.items():
        if arg.startswith(folder + "/"):
            return label + arg[len(folder) :]
    return arg


def finetune_status(tune: FineTune, finetunes: Path, out: Path) -> str:
    if (out / FINETUNE_FOLDER / tune.name / FINETUNE_SUMMARY_FILE).is_file():
        return "done"
    return "trained" if (finetunes / tune.name / TRAIN_CARD_FILE).is_file() else "todo"


def finetune_stage(tunes: Sequence[FineTune], choice: dict, finetunes: Path, out: Path) -> list[str]:
    """Every fine-tune not done yet, then the choice and the findings table written beside the summaries;
    returns the names of those fca refused."""
    failed = []
    for tune in tunes:
        if finetune_status(tune, finetunes, out) != "done":
            print(f"== {tune.name} ({tune.role}): {finetune_status(tune, finetunes, out)}", flush=True)
            if not finetune_one(tune, finetunes, out):
                failed.append(tune.name)
    (out / FINETUNE_FOLDER).mkdir(parents=True, exist_ok=True)
    write_json(out / FINETUNE_FOLDER / CHOICE_FILE, choice)
    if not failed:
        (out / FINETUNE_FOLDER / FINDINGS_FILE).write_text(finetune_table(out) + "\n", encoding="utf-8")
    return failed


def finetune_listing(tunes: Sequence[FineTune], choice: dict, finetunes: Path, out: Path) -> str:
    lines = [f"{role}: {choice[role]['variant']}" for role in (MOST_STATIC, LEAST_STATIC)]
    lines += [f"{t.name:22s} {t.role:13s} {finetune_status(t, finetunes, out):8s}" for t in tunes]
    return "\n".join([*lines, *(f"left out: {line}" for line in choice["left_out"])])


def finetune_table(out: Path) -> str:
    """The fine-tunes as mean ± sd over seeds of each role, then each fine-tune, in Markdown."""
    runs = read_finetunes(out)
    return "\n\n".join(to_markdown(table(runs)) for table in (finetune_seed_table, finetune_runs_table))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = study_parser(
        __doc__.splitlines()[0],
        Path("/tmp/router_design"),
        ROOT / "data" / "router_design",
        "weights, audits, exports",
        tuple(VARIANTS),
        SEEDS,
    )
    parser.add_argument(
        "--finetune",
        action="store_true",
        help="the fine-tune stage instead: the static top-k exports of the shipped MoE and of the most and least "
        "static designs, fine-tuned (--work is only read)",
    )
    parser.add_argument(
        "--finetune-work",
        type=Path,
        default=Path("/tmp/router_finetune"),
        help="the fine-tunes, and the shipped MoE's audit and export",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.finetune:
        run_study(args, plan(args.seeds, args.variants), run_one, findings_table)
        return
    tunes, choice = finetune_plan(args.work, args.finetune_work, args.out)
    index, count = args.shard
    tunes = tunes[index::count]
    if args.table:
        print(finetune_table(args.out))
        return
    failed = [] if args.list else finetune_stage(tunes, choice, args.finetune_work, args.out)
    print(finetune_listing(tunes, choice, args.finetune_work, args.out))
    if failed:
        raise SystemExit(f"fca refused {len(failed)} fine-tunes: {', '.join(failed)}")


if __name__ == "__main__":
    main()
