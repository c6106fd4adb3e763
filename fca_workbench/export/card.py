"""An exported checkpoint's model card (``README.md``, and the same facts as ``export_card.json``): which
checkpoint it came from (path and fingerprint), which static profile was folded in, from which calibration
data, and what the audit measured for that profile when the profile came from one.

The card is bound to its source (``card_binding``: ``source.fingerprint`` and ``calibration.fingerprint``, the
binding of ``results.binding``): the model the profile was folded from and the calibration windows it was
estimated on, which a profile saved by an audit is checked against before it is folded."""

from fca_workbench.results.binding import binding

CARD_JSON = "export_card.json"  # beside the README: the card's facts, machine-readable


def card_binding(card: dict) -> dict:
    """The binding an export card records: its source checkpoint and the calibration windows of its profile."""
    return binding(card["source"]["fingerprint"], {"calibration": card["calibration"]["fingerprint"]})


def export_card_markdown(card: dict) -> str:
    """The README of an exported folder, from the card dict ``export_static`` builds."""
    source, calibration, audit = card["source"], card["calibration"], card.get("audit")
    bound = card_binding(card)
    rows = [
        f"| source checkpoint | `{source['path']}` ({source['arch']}) |",
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
        rows.append(f"| from the audit | `{audit['folder']}` |")
        if audit.get("nll") is not None:
            rows.append(f"| the audit's NLL for `{card['profile']}` (nats) | {audit['nll']:.6f} |")
        retention = audit.get("retention")
        if retention is not None:
            ci = retention.get("ci95")
            shown = f"{retention['value']:.4f}" + (f" (95% CI {ci[0]:.4f} to {ci[1]:.4f})" if ci else "")
            rows.append(f"| the audit's gap retention for `{card['profile']}` | {shown} |")
    return "\n".join(
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
            f"Made again with: `{card['command']}`",
            "",
        ]
    )
