"""Why a router's static top-k profile can score below the uniform mixture downstream (docs/guides/downstream.md):
each document of a shipped task answered under several conditions, broken down by play and by kind of item, with
each condition's log-likelihood of the true choice and of the distractors, and the profiles' expert weights.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/downstream_topk.py [--checkpoint data/checkpoints/moe-s0]
        [--task fca_play_choice] [--conditions correct,global_mean,layer_mean,layer_mean_topk,random_topk]
        [--max-windows N]

The model, the calibration profiles and the lm-eval run are ``fca eval``'s own (``run_eval``'s session and
``evaluate``), so the accuracies equal the ``downstream.json`` of the same settings. Writes
benchmarks/results/downstream_topk.json (per condition: accuracy by play and kind, mean log-likelihood per token of
the true and the other choices, the mean margin of the true choice over the best distractor, how often the choice
answered is the one of fewest tokens, and the accuracy difference against ``global_mean`` by kind, paired and
clustered by play) and prints it.
"""

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import lm_eval.evaluator

from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.downstream.clustered import clustered_mean
from fca_workbench.downstream.eval_settings import EvalSettings, comma_names
from fca_workbench.downstream.evaluation import BOOTSTRAP_ITERS, load_tasks, resolve_tasks
from fca_workbench.downstream.frozen import ConditionLogits
from fca_workbench.downstream.lm import WorkbenchLM
from fca_workbench.results.conditions import GLOBAL_MEAN, LAYER_MEAN, LAYER_MEAN_TOPK

RESULTS = Path(__file__).resolve().parent / "results" / "downstream_topk.json"


def documents(lm: WorkbenchLM, loaded: dict, task: str, tokenizer) -> list[dict]:
    """Per document: its play, kind, label, whether it was answered right, and per choice its summed
    log-likelihood and its token count."""
    results = lm_eval.evaluator.evaluate(lm=lm, task_dict=loaded, bootstrap_iters=BOOTSTRAP_ITERS, log_samples=True)
    rows = []
    for sample in results["samples"][task]:
        doc = sample["doc"]
        context = doc["context"]
        tokens = [len(tokenizer.encode(context + c)) - len(tokenizer.encode(context)) for c in doc["choices"]]
        loglik = [float(r[0]) for r in sample["filtered_resps"]]
        rows.append(
            {"play": doc["play"], "kind": doc["kind"], "label": doc["label"], "acc": sample["acc"]}
            | {"loglik": loglik, "tokens": tokens}
        )
    return rows


def summary(rows: list[dict]) -> dict:
    """Accuracy by play and kind; mean log-likelihood per token of the true choice and of the distractors; the mean
    margin (true minus best distractor, nats) by kind."""
    by: dict[str, list[float]] = defaultdict(list)
    true_nll: dict[str, list[float]] = defaultdict(list)
    other_nll: dict[str, list[float]] = defaultdict(list)
    margin: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by[f"play {row['play']}"].append(row["acc"])
        by[row["kind"]].append(row["acc"])
        by[f"play {row['play']} {row['kind']}"].append(row["acc"])
        label, ll, n = row["label"], row["loglik"], row["tokens"]
        true_nll[row["kind"]].append(-ll[label] / n[label])
        other_nll[row["kind"]] += [-ll[i] / n[i] for i in range(len(ll)) if i != label]
        margin[row["kind"]].append(ll[label] - max(ll[i] for i in range(len(ll)) if i != label))
    return {
        "acc": statistics.fmean(r["acc"] for r in rows),
        "acc_by": {key: statistics.fmean(v) for key, v in sorted(by.items())},
        "true_nll_per_token": {k: statistics.fmean(v) for k, v in sorted(true_nll.items())},
        "other_nll_per_token": {k: statistics.fmean(v) for k, v in sorted(other_nll.items())},
        "margin": {k: statistics.fmean(v) for k, v in sorted(margin.items())},
        "chose_fewest_tokens": statistics.fmean(chosen_fewest(row) for row in rows),
        "true_has_fewest_tokens": statistics.fmean(row["tokens"][row["label"]] == min(row["tokens"]) for row in rows),
    }


def chosen_fewest(row: dict) -> bool:
    """Whether the choice answered (the largest summed log-likelihood) is one with the fewest tokens."""
    chosen = max(range(len(row["loglik"])), key=row["loglik"].__getitem__)
    return row["tokens"][chosen] == min(row["tokens"])


def against(rows: list[dict], low: list[dict]) -> dict:
    """Per kind of item and overall, the accuracy difference ``rows`` − ``low`` over the same documents, paired,
    with its standard error clustered by play (``clustered_mean``: CR1, t on G − 1 df)."""
    out = {}
    for kind in sorted({r["kind"] for r in rows}) + ["all"]:
        pairs = [(r, b) for r, b in zip(rows, low, strict=True) if kind in ("all", r["kind"])]
        figure = clustered_mean([r["acc"] - b["acc"] for r, b in pairs], [r["play"] for r, _ in pairs])
        out[kind] = {k: figure[k] for k in ("value", "stderr", "ci95", "clusters")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="data/checkpoints/moe-s0")
    parser.add_argument("--task", default="fca_play_choice")
    parser.add_argument("--conditions", default="correct,global_mean,layer_mean,layer_mean_topk,random_topk")
    parser.add_argument("--max-windows", type=int, default=None)
    args = parser.parse_args()
    conditions = comma_names(args.conditions)
    with tempfile.TemporaryDirectory() as cache:
        audit = AuditSettings(args.checkpoint, max_windows=args.max_windows, cache=cache)
        settings = EvalSettings(audit, [args.task], conditions)
        manager, tasks = resolve_tasks(settings.tasks)
        loaded = load_tasks(manager, tasks, audit.seed)
        session = ReplaySession.open(audit, Path(cache), read_now=(CALIBRATION,))
        profiles = session.profiles
        weights = {
            name: [[round(float(w), 4) for w in layer.reshape(-1)] for layer in profiles[name]]
            for name in (LAYER_MEAN, LAYER_MEAN_TOPK)
        }
        lm = WorkbenchLM(session.model, session.tokenizer, session.windows(CALIBRATION).shape[1], session.batch_size)
        figures, rows = {}, {}
        for condition in conditions:
            lm.use(ConditionLogits(session, condition))
            rows[condition] = documents(lm, loaded, args.task, session.tokenizer)
            figures[condition] = summary(rows[condition])
        for condition in conditions:
            if GLOBAL_MEAN in rows and condition != GLOBAL_MEAN:
                figures[condition]["minus_global_mean"] = against(rows[condition], rows[GLOBAL_MEAN])
    out = {"checkpoint": args.checkpoint, "task": args.task, "max_windows": args.max_windows}
    out |= {"profiles": weights, "conditions": figures}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
