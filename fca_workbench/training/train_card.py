"""A trained checkpoint's model card (``README.md``): what was trained, how to train it again (the exact
command, the controller-design flags included) and what it reached.

The README is a Hugging Face model card (``huggingface_hub.ModelCard``) whose front matter lists the eval NLL
and, with ``--audit-every``, the last mini-audit's figures as eval results, so the hub shows them beside the
model; ``model_card.json`` keeps the same facts for the workbench's readers."""

import math

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from fca_workbench.data.corpus import CORPUS_DIR
from fca_workbench.foundation.files import dumps_json
from fca_workbench.training.train_settings import DETACHED, NORMED, TrainSettings

TRAIN_TAG = "fca-trained"  # every fca train checkpoint's tag on the hub, beside its arch's


def training_model_card(card: dict, final_audit: dict | None = None) -> ModelCard:
    """The README of a trained checkpoint: ``model_card_markdown`` under the hub's front matter;
    ``final_audit``: the last row of ``audit_log.csv`` (the mini-audit of the saved weights), if any."""
    data = ModelCardData(
        model_name=f"{card['arch']} (seed {card['settings']['seed']})",
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=[TRAIN_TAG, card["arch"]],
        eval_results=eval_results(card, final_audit or {}),
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{model_card_markdown(card)}")


def eval_results(card: dict, final_audit: dict) -> list[EvalResult]:
    """The eval NLL and the mini-audit's figures (``audit.mini.log_row``'s columns, their CI ends left to
    ``audit_log.csv``), each on the eval split; a figure the audit could not compute (NaN) is left out."""
    figures = {"eval_nll": card["eval_nll"]}
    figures.update(
        (f"mini_audit_{name}", float(value))
        for name, value in final_audit.items()
        if name not in ("step", "audit_seconds") and not name.endswith(("_lo", "_hi"))
    )
    return [
        EvalResult(
            task_type="text-generation",
            dataset_type="shakespeare",  # the corpus's source, split by work (data/README.md)
            dataset_name=f"Shakespeare ({eval_windows_text(card)})",
            dataset_split="eval",
            metric_type=name,
            metric_value=value,
        )
        for name, value in figures.items()
        if math.isfinite(value)
    ]


def model_card_markdown(card: dict) -> str:
    s = card["settings"]
    audit_flags = (
        f" --audit-every {s['audit_every']} --audit-windows {s['audit_windows']}" if s.get("audit_every") else ""
    )
    audit = card.get("audit")
    audit_rows = (
        []
        if not audit
        else [
            f"| mini-audits (`audit_log.csv`: every {audit['every']} steps and at the end, {audit['windows']} windows) "
            f"| {audit['audits']}, {audit['audit_seconds']} s = {100 * audit['fraction_of_training']:.1f}% of training time |"
        ]
    )
    common = (
        f"--seed {s['seed']} --window {s['window']} --steps {s['steps']} --batch-size {s['batch_size']} --lr {s['lr']}"
        + ("" if s["warmup"] == TrainSettings.warmup else f" --warmup {s['warmup']}")
    )
    if s["hf_config"] is None:
        command = (
            f"fca train --arch {s['arch']} --layers {s['layers']} --width {s['width']} --heads {s['heads']} {common}"
            + (f" --gate-groups {s['gate_groups']}" if s["gate_groups"] else "")
            + controller_flags(s)
            + audit_flags
            + " --out DIR"
        )
        std = card["within_layer_coefficient_std"]
        std_text = "n/a (no controller)" if std is None else std
        config_lines = []
    else:
        model = "--hf-config CONFIG.json" if s.get("init") is None else f"--init {s['init']}"
        command = f"fca train {model} {common}{router_flags(s)}{audit_flags} --out DIR"
        std_text = "not computed (transformers model)"
        config_json = dumps_json(s["hf_config"]).decode().rstrip()
        holds = "where `CONFIG.json` holds" if s.get("init") is None else "where the starting checkpoint's config holds"
        config_lines = ["", holds, "", "```json", config_json, "```"]
        aux = card.get("router_aux_loss_coef")
        if aux is not None:
            objective = f"Trained on next-token NLL + {aux} × the router load-balancing loss"
            if s.get("router_z_loss"):
                objective += f" + {s['router_z_loss']} × the router z-loss"
            if s.get("router_input") == DETACHED:
                objective += ", the routers reading the normed hidden state detached from the gradient"
            if s.get("freeze_routers"):
                objective += ", the routers' weights frozen as they started"
            config_lines += ["", f"{objective}; the logged loss is the NLL."]
    return "\n".join(
        [
            f"# {card['arch']} (seed {s['seed']})",
            "",
            f"Trained by the FCA workbench on the train split of `{CORPUS_DIR.name}/` (Shakespeare, split by work).",
            "",
            "| figure | value |",
            "|---|---|",
            f"| parameters | {card['params']:,} |",
            f"| tokens seen | {card['tokens_seen']:,} |",
            f"| final train loss (nats) | {card['final_train_loss']} |",
            f"| eval NLL (nats, {eval_windows_text(card)}) | {card['eval_nll']} |",
            f"| within-(layer, slot) coefficient std | {std_text} |",
            f"| training time (s, this machine) | {card['train_seconds']} |",
            *audit_rows,
            "",
            f"Reproduce: `{command}`",
            *config_lines,
            *controller_lines(s),
            "",
        ]
    )


CONTROLLER_FLAGS = ("gate_range", "gate_input", "controller_weight_decay", "controller_lr_mult")
GATE_FORMULAS = {"2sigmoid": "2·sigmoid(z)", "sigmoid": "sigmoid(z)", "1+tanh": "1 + tanh(z)"}
GATE_INPUT_TEXT = {
    "normed": "rmsnorm(h), the normalised block input",
    "raw": "h, the raw residual stream",
    "detached": "rmsnorm(h) detached: no gradient reaches the hidden state through the controller",
}


def router_flags(s: dict) -> str:
    """The router-design flags a ``--hf-config`` run was given (older cards lack them)."""
    given = {"router_z_loss": s.get("router_z_loss") or None, "router_input": s.get("router_input")}
    if given["router_input"] == NORMED:
        given["router_input"] = None
    valued = "".join(f" --{k.replace('_', '-')} {v}" for k, v in given.items() if v is not None)
    return valued + (" --freeze-routers" if s.get("freeze_routers") else "")


def controller_flags(s: dict) -> str:
    """The controller-design flags a run was given (``s``: a model card's settings; older cards lack them)."""
    given = {k: s.get(k) for k in CONTROLLER_FLAGS if s.get(k) is not None}
    if given.get("controller_lr_mult") == 1.0:
        del given["controller_lr_mult"]
    return "".join(f" --{k.replace('_', '-')} {v}" for k, v in given.items())


def controller_lines(s: dict) -> list[str]:
    """The FeatureGate controller's design and optimizer settings, for the model card."""
    if s.get("arch") != "featuregate":
        return []
    gate = s.get("gate_range") or "2sigmoid"
    decay = s.get("controller_weight_decay")
    return [
        "",
        f"Controller (one per block): gates = {GATE_FORMULAS[gate]} with z = W·x + b, W and b starting at zero"
        f" (gates start at {0.5 if gate == 'sigmoid' else 1}), x = {GATE_INPUT_TEXT[s.get('gate_input') or 'normed']};"
        f" {s['gate_groups'] or s['heads']} channel groups per branch; weight decay"
        f" {s['weight_decay'] if decay is None else decay} (the model's: {s['weight_decay']}), learning rate"
        f" {s.get('controller_lr_mult', 1.0)} × the model's.",
    ]


def eval_windows_text(card: dict) -> str:
    """Which eval windows the card's figures are over: their count, length and how they were picked."""
    spread = {"even": ", spread evenly over the eval split", "all": ", the whole eval split"}
    windows = f"{card['eval_windows']} windows of {card['settings']['window']}"
    return windows + spread.get(card.get("eval_window_sampling", ""), "")
