"""An exported checkpoint's model card (``README.md``, and the same facts as ``export_card.json``): which
checkpoint it came from (its path from the exported folder, its hub id and commit where it came from the hub,
its fingerprint), which static profile was folded in, from which calibration data, and what the audit measured
for that profile when the profile came from one.

The README is a Hugging Face model card (``huggingface_hub.ModelCard``) whose front matter says how to load it
(``library_name: transformers``), what it was made from (``base_model``, the source's hub id where it came from
the hub) and ``tags``; every path in it is relative to the exported folder, so the card says nothing of the
machine that wrote it and stays true wherever the folder is copied.

The card is bound to its source (``card_binding``: ``source.fingerprint`` and ``calibration.fingerprint``, the
binding of ``results.binding``): the model the profile was folded from and the calibration windows it was
estimated on, which a profile saved by an audit is checked against before it is folded."""

from huggingface_hub import ModelCard, ModelCardData

from fca_workbench.results.binding import binding
from fca_workbench.results.conditions import LOW

CARD_JSON = "export_card.json"  # beside the README: the card's facts, machine-readable
EXPORT_TAG = "fca-static-export"  # every exported folder's tag on the hub, beside its profile's


def retention_cell(retention: dict) -> str:
    """A retention as the card shows it: the value and its CI over its reference, or why there is none (a gap that
    does not resolve is no figure)."""
    reference = retention.get("reference", LOW)
    gap = retention.get("denominator")
    if retention.get("value") is None:
        over = (
            "" if gap is None else f" ({gap['value']:+.4f} nats, 95% CI {gap['ci95'][0]:+.4f} to {gap['ci95'][1]:+.4f})"
        )
        return f"unresolved: the {reference}-to-correct gap{over} does not resolve"
    ci = retention.get("ci95")
    shown = f"{retention['value']:.4f}" + (f" (95% CI {ci[0]:.4f} to {ci[1]:.4f})" if ci and None not in ci else "")
    return f"{shown} of the {reference}-to-correct gap"


def card_binding(card: dict) -> dict:
    """The binding an export card records: its source checkpoint and the calibration windows of its profile."""
    return binding(card["source"]["fingerprint"], {"calibration": card["calibration"]["fingerprint"]})


def card_data(card: dict) -> ModelCardData:
    """The card's front matter: transformers loads it; its base model where the source came from the hub."""
    hub = card["source"].get("hub")
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        base_model=hub["id"] if hub else None,
        tags=[EXPORT_TAG, card["profile"], card["source"]["arch"]],
    )


def export_model_card(card: dict) -> ModelCard:
    """The README of an exported folder, from the card dict ``export_static`` builds."""
    source, calibration, audit = card["source"], card["calibration"], card.get("audit")
    bound = card_binding(card)
    hub = source.get("hub")
    rows = [f"| source checkpoint | `{source['path']}` ({source['arch']}), from this folder |"]
    if hub:
        revision = f" (asked as `{hub['revision']}`)" if hub["revision"] else ""
        rows.append(f"| source on the hub | `{hub['id']}` at commit `{hub['commit']}`{revision} |")
    rows += [
        f"| source fingerprint | `{bound['model']}` |",
        f"| static profile folded in | `{card['profile']}` |",
        f"| calibration data | `{calibration['source']}`: {calibration['windows']} windows of "
        f"{calibration['window']} tokens |",
        f"| calibration windows' fingerprint | `{bound['data']['calibration']}` |",
        f"| exported as | `{card['model_type']}`, {card['params']:,} parameters (source: {source['params']:,}) |",
    ]
    if card.get("experts"):
        rows.append(f"| experts per MoE block | {card['experts']['kept']} of {card['experts']['source']} |")
    if audit:
        rows.append(f"| from the audit | `{audit['folder']}`, from this folder |")
        if audit.get("nll") is not None:
            rows.append(f"| the audit's NLL for `{card['profile']}` (nats) | {audit['nll']:.6f} |")
        retention = audit.get("retention")
        if retention is not None:
            rows.append(f"| the audit's gap retention for `{card['profile']}` | {retention_cell(retention)} |")
    body = "\n".join(
        [
            f"# {source['arch']} with its controller folded away (`{card['profile']}`)",
            "",
            "Written by `fca export`: the controller is gone and its static profile is folded into the weights,",
            "so every token gets the coefficients the audit's static-profile condition replays.",
            "",
            "| | |",
            "|---|---|",
            *rows,
            "",
            f"Made again, from the folder that holds this one, with: `{card['command']}`",
            "",
        ]
    )
    return ModelCard(f"---\n{card_data(card).to_yaml()}\n---\n\n{body}")
