"""Plain-language verdicts and the printed three-column report of an ``audit.json``.

The thresholds that turn figures into words are stated in the sentences themselves, so a reader can
disagree with a verdict using the numbers beside it.
"""

import itertools
import textwrap
from collections.abc import Iterable

from fca_workbench.adapters.families import DELTA_RULE_GATE, LSTM_GATE, SELECTIVE_GATE, SELECTIVE_SSM
from fca_workbench.results.conditions import REFERENCE
from fca_workbench.results.verdicts import retention_phrase

# What a static profile (global_mean ... layer_position_mean) makes of a controller kind, where it is more
# than "the controller without its input".
STATIC_PROFILE_MEANING = {
    SELECTIVE_SSM: "a static profile of a selective SSM's Δ, B and C is a time-invariant SSM (a linear "
    "recurrence with the same Δ, B, C at every token, as in S4): its ΔNLL is what selectivity is worth.",
    DELTA_RULE_GATE: "a static profile of a delta rule's decay and β is a linear attention with a fixed decay "
    "and write strength: a time-invariant recurrence.",
    LSTM_GATE: "a static profile of input and forget gates is a recurrence with fixed gates: time-invariant.",
    SELECTIVE_GATE: "a static profile of a gated linear recurrence's gates is a time-invariant recurrence.",
}


def nll_dtype(audit: dict) -> str:
    """The dtype an audit's model computed its NLLs in (``settings.dtype``; an audit that records none ran in
    float32, the default)."""
    return audit.get("settings", {}).get("dtype", "float32")


def nll_label(audits: Iterable[dict], label: str = "NLL") -> str:
    """``label`` with the dtype(s) the audits' NLLs were computed in, as every printed NLL is headed:
    ``NLL (bfloat16)``; audits in several dtypes name them all (no audits: ``label`` alone)."""
    dtypes = sorted({nll_dtype(audit) for audit in audits})
    return f"{label} ({', '.join(dtypes)})" if dtypes else label


def format_report(audit: dict, width: int = 38) -> str:
    """The condition table, then the three properties side by side, each with figures and verdict."""
    model = audit["model"]
    lines = [
        f"FCA audit of {model['path']} ({model['arch']}, {model['params']:,} params)",
        f"eval: {audit['data']['eval']['windows']} windows × {audit['data']['eval']['window']} tokens "
        f"from {audit['data']['eval']['source']}",
        "",
        f"{'condition':22s} {nll_label([audit]):>14s} {'95% CI':>19s} {'ΔNLL':>9s} {'95% CI':>21s}",
    ]
    for name, c in audit["conditions"].items():
        lines.append(
            f"{name:22s} {c['nll']:14.4f} [{c['ci95'][0]:7.4f}, {c['ci95'][1]:7.4f}] {c['delta']:+9.4f} "
            f"[{c['delta_ci95'][0]:+8.4f}, {c['delta_ci95'][1]:+8.4f}]"
        )
    lines += per_layer_table(audit.get("per_layer"))
    lines += per_controller_lines(audit.get("per_controller"))
    lines += static_profile_notes(model.get("controller_kinds", []), width * 3)
    lines += left_out_notes(model.get("left_out", []), width * 3)
    columns = [
        ("1. Coefficient variation", variation_figures(audit), audit["verdict"]["coefficient_variation"]),
        ("2. Assignment dependence", assignment_figures(audit), audit["verdict"]["assignment_dependence"]),
        ("3. Conditional execution", execution_figures(audit), audit["verdict"]["conditional_execution"]),
    ]
    blocks = [
        [title, "-" * len(title), *figures, "", *textwrap.wrap(verdict, width)] for title, figures, verdict in columns
    ]
    lines.append("")
    for row in itertools.zip_longest(*blocks, fillvalue=""):
        lines.append("  ".join(cell.ljust(width) for cell in row).rstrip())
    return "\n".join(lines + staticness_section(audit, width * 3))


def staticness_section(audit: dict, width: int) -> list[str]:
    """Each retention with both ends and its reference (an unresolved one is no percentage), then the staticness
    verdict (audits written before it had none)."""
    if not audit["retention"]:
        return []
    title = "4. Staticness (gap retention against its reference; nats, 95% CIs)"
    lines = ["", title, "-" * len(title)]
    for name, r in audit["retention"].items():
        lines += textwrap.wrap(f"ret. {name}: {retention_phrase(name, r)}", width, subsequent_indent="    ")
        for other, beside in (r.get("other_references") or {}).items():
            lines += textwrap.wrap(f"     against {other}: {retention_phrase(name, beside)}", width)
    verdict = audit["verdict"].get("staticness")
    return lines + (["", *textwrap.wrap(verdict, width)] if verdict else [])


def left_out_notes(left_out: list[str], width: int) -> list[str]:
    """What the audit saw depend on the input and did not replay: every condition leaves it live."""
    if not left_out:
        return []
    lines = [
        "",
        *textwrap.wrap(
            f"Left out ({len(left_out)}, input-dependent but not replayed; live in every condition):", width
        ),
    ]
    return lines + [
        wrapped
        for entry in left_out
        for wrapped in textwrap.wrap(entry, width, initial_indent="- ", subsequent_indent="  ")
    ]


def static_profile_notes(kinds: list[str], width: int) -> list[str]:
    """One note per controller kind whose static profiles have a name of their own (``STATIC_PROFILE_MEANING``)."""
    notes = [STATIC_PROFILE_MEANING[kind] for kind in dict.fromkeys(kinds) if kind in STATIC_PROFILE_MEANING]
    return [line for note in notes for line in ["", *textwrap.wrap(note[0].upper() + note[1:], width)]]


def per_layer_table(rows: list[dict] | None) -> list[str]:
    """ΔNLL of each condition applied at one decoder layer alone (all its controllers together): one line per
    layer, one column per condition."""
    if not rows:
        return []
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    delta = {(r["layer"], r["condition"]): r["delta"] for r in rows}
    lines = [
        "",
        "ΔNLL with the condition at one decoder layer only (all its controllers):",
        "layer " + " ".join(f"{c:>19s}" for c in conditions),
    ]
    for layer in sorted({r["layer"] for r in rows}):
        lines.append(f"{layer:5d} " + " ".join(f"{delta[(layer, c)]:+19.4f}" for c in conditions))
    return lines


def per_controller_lines(rows: list[dict] | None) -> list[str]:
    """ΔNLL of each condition applied at one controller alone, in the decoder layers that hold several: one
    line per controller (its module path), one column per condition."""
    if not rows:
        return []
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    delta = {(r["controller"], r["condition"]): r["delta"] for r in rows}
    lines = ["", "ΔNLL with the condition at one controller only (layers of several controllers):"]
    for controller in dict.fromkeys(r["controller"] for r in rows):
        figures = ", ".join(f"{c} {delta[(controller, c)]:+.4f}" for c in conditions if (controller, c) in delta)
        lines.append(f"  {controller}: {figures}")
    return lines


def variation_figures(audit: dict) -> list[str]:
    if audit["variation"] is None:
        return ["(no coefficients)"]
    v, r = audit["variation"], audit["variance"]
    rows = [("within std", v["within_std"]), ("CV", v["cv"])] + [(k.removeprefix("r2_"), r[k]) for k in r]
    return [f"{name:24s}{value:>10.4f}" if value is not None else f"{name:24s}{'n/a':>10s}" for name, value in rows]


def assignment_figures(audit: dict) -> list[str]:
    return [f"Δ{name:23s}{c['delta']:+10.4f}" for name, c in audit["conditions"].items() if name != REFERENCE]


def execution_figures(audit: dict) -> list[str]:
    e = audit["execution"]
    return (
        [
            f"{'blocks executed':24s}{e['blocks_executed']:>6d}/{e['blocks_total']}",
            f"{'fraction executed':24s}{e['fraction_executed']:>10.3f}",
            f"{'controller calls':24s}{e['controller_calls']:>10d}",
            f"{'GFLOPs (one batch)':24s}{e['flops'] / 1e9:>10.2f}",
            f"{'latency (ms)':24s}{e['latency_ms']:>10.1f}",
            f"{'latency / ' + e.get('baseline', 'dense'):24s}{e['latency_ratio_vs_dense']:>10.2f}",
        ]
        + expert_figures(e)
        + positive_control_figures(e.get("positive_control"))
    )


def expert_figures(e: dict) -> list[str]:
    if "expert_fraction_executed" not in e:
        return []
    return [f"{'expert fraction executed':24s}{e['expert_fraction_executed']:>10.3f}"]


def positive_control_figures(control: dict | None) -> list[str]:
    """The skip-below-median-gate control, shown so a reader sees what a real saving looks like."""
    if control is None:
        return []
    return [
        "",
        "positive control (MLP skipped",
        "below the median gate):",
        f"{'  fraction executed':24s}{control['fraction_executed']:>10.3f}",
        f"{'  GFLOPs (one batch)':24s}{control['flops'] / 1e9:>10.2f}",
        f"{'  latency / Dense':24s}{control['latency_ratio_vs_dense']:>10.2f}",
    ]
