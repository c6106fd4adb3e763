"""Plain-language verdicts and the printed three-column report of an ``audit.json``.

The thresholds that turn figures into words are stated in the sentences themselves, so a reader can
disagree with a verdict using the numbers beside it.
"""

import itertools
import textwrap

from .sweep import carrying_layers

STATIC_RETENTION = 0.95  # a static profile retaining this much of the gap counts as "largely static"


def verdicts(audit: dict) -> dict:
    return {
        "coefficient_variation": variation_verdict(audit),
        "assignment_dependence": assignment_verdict(audit),
        "conditional_execution": execution_verdict(audit),
    }


def variation_verdict(audit: dict) -> str:
    variation, variance = audit["variation"], audit["variance"]
    if variation is None:
        return "No controller: this model has no coefficients to vary."
    if variance["r2_layer"] is None:
        return "Coefficients are constant over the eval set: they do not vary at all."
    return (
        f"Coefficients vary (within-layer std {variation['within_std']:.4f}, CV {variation['cv']:.3f}); "
        f"layer identity explains {variance['r2_layer']:.1%} of their variance, layer×slot "
        f"{variance['r2_layer_slot']:.1%}; adding position reaches {variance['r2_layer_slot_position']:.1%}, "
        f"adding the input window {variance['r2_layer_slot_window']:.1%}."
    )


def assignment_verdict(audit: dict) -> str:
    conditions, retention = audit["conditions"], audit["retention"]
    if "cross_input" not in conditions:
        return "No controller: there are no coefficients to reassign."
    cross, shuffle, static = conditions["cross_input"], conditions["token_shuffle"], retention["layer_mean"]
    significant = cross["delta_ci95"][0] > 0 or shuffle["delta_ci95"][0] > 0
    penalties = (
        f"cross-input reassignment changes NLL by {cross['delta']:+.4f} nats "
        f"[{cross['delta_ci95'][0]:+.4f}, {cross['delta_ci95'][1]:+.4f}], token shuffling by "
        f"{shuffle['delta']:+.4f} [{shuffle['delta_ci95'][0]:+.4f}, {shuffle['delta_ci95'][1]:+.4f}]"
    )
    if static["value"] is None:
        return f"No gap to retain (global_mean scores as well as correct): {penalties}."
    kept = f"the static layerwise profile retains {static['value']:.2%} of the Correct-to-GlobalMean gap"
    if static["value"] >= STATIC_RETENTION:
        lead = "Weak assignment dependence (static profile ≥ 95% of the gap)"
    elif significant:
        lead = "The frozen model depends on which coefficients each input gets"
    else:
        lead = "No significant assignment dependence (95% CIs include 0)"
    return f"{lead}: {penalties}; {kept}.{per_layer_sentence(audit)}"


def per_layer_sentence(audit: dict) -> str:
    """Which layers carry the dependence, when the audit has a per-layer sweep (else nothing)."""
    rows = audit.get("per_layer")
    largest, significant = carrying_layers(rows or [])
    if largest is None:
        return ""
    delta = next(r["delta"] for r in rows if r["layer"] == largest and r["condition"] == "cross_input")
    listed = ", ".join(map(str, significant)) or "none"
    return (
        f" Per layer (each alone, the others correct): cross-input reassignment costs most at layer {largest} "
        f"({delta:+.4f} nats); layers whose cross-input 95% CI excludes 0: {listed}."
    )


BASELINES = {"dense": "the shape-matched Dense", "static_mixture": "the static mixture (every expert for every token)"}


def execution_verdict(audit: dict) -> str:
    e = audit["execution"]
    speed = f"latency {e['latency_ratio_vs_dense']:.2f}× {BASELINES[e.get('baseline', 'dense')]}"
    if "expert_fraction_executed" in e:
        return (
            f"Conditional execution by routing: {e['expert_fraction_executed']:.3f} of the token × expert "
            f"evaluations ran; {speed}."
        )
    if e["fraction_executed"] >= 1.0:
        return (
            f"No conditional execution: every block ran for every token ({e['blocks_executed']}/{e['blocks_total']} "
            f"block passes, fraction executed 1.000, {e['controller_calls']} controller calls); {speed}."
        )
    return (
        f"Conditional execution: fraction executed {e['fraction_executed']:.3f} "
        f"({e['controller_calls']} controller calls); {speed}."
    )


def format_report(audit: dict, width: int = 38) -> str:
    """The condition table, then the three properties side by side, each with figures and verdict."""
    model = audit["model"]
    lines = [
        f"FCA audit of {model['path']} ({model['arch']}, {model['params']:,} params)",
        f"eval: {audit['data']['eval']['windows']} windows × {audit['data']['eval']['window']} tokens "
        f"from {audit['data']['eval']['source']}",
        "",
        f"{'condition':22s} {'NLL':>8s} {'95% CI':>19s} {'ΔNLL':>9s} {'95% CI':>21s}",
    ]
    for name, c in audit["conditions"].items():
        lines.append(
            f"{name:22s} {c['nll']:8.4f} [{c['ci95'][0]:7.4f}, {c['ci95'][1]:7.4f}] {c['delta']:+9.4f} "
            f"[{c['delta_ci95'][0]:+8.4f}, {c['delta_ci95'][1]:+8.4f}]"
        )
    lines += per_layer_table(audit.get("per_layer"))
    columns = [
        ("1. Coefficient variation", variation_figures(audit), audit["verdict"]["coefficient_variation"]),
        ("2. Assignment dependence", assignment_figures(audit), audit["verdict"]["assignment_dependence"]),
        ("3. Conditional execution", execution_figures(audit), audit["verdict"]["conditional_execution"]),
    ]
    blocks = [[title, "-" * len(title), *figures, "", *textwrap.wrap(verdict, width)] for title, figures, verdict in columns]
    lines.append("")
    for row in itertools.zip_longest(*blocks, fillvalue=""):
        lines.append("  ".join(cell.ljust(width) for cell in row).rstrip())
    return "\n".join(lines)


def per_layer_table(rows: list[dict] | None) -> list[str]:
    """ΔNLL of each condition applied at one layer alone: one line per layer, one column per condition."""
    if not rows:
        return []
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    delta = {(r["layer"], r["condition"]): r["delta"] for r in rows}
    lines = ["", "ΔNLL with the condition at one layer only:", "layer " + " ".join(f"{c:>19s}" for c in conditions)]
    for layer in sorted({r["layer"] for r in rows}):
        lines.append(f"{layer:5d} " + " ".join(f"{delta[(layer, c)]:+19.4f}" for c in conditions))
    return lines


def variation_figures(audit: dict) -> list[str]:
    if audit["variation"] is None:
        return ["(no coefficients)"]
    v, r = audit["variation"], audit["variance"]
    rows = [("within std", v["within_std"]), ("CV", v["cv"])] + [(k.removeprefix("r2_"), r[k]) for k in r]
    return [f"{name:24s}{value:>10.4f}" if value is not None else f"{name:24s}{'n/a':>10s}" for name, value in rows]


def assignment_figures(audit: dict) -> list[str]:
    rows = [f"Δ{name:23s}{c['delta']:+10.4f}" for name, c in audit["conditions"].items() if name != "correct"]

    rows += [
        f"ret. {name:19s}" + ("       n/a" if r["value"] is None else f"{r['value']:>10.2%}")
        for name, r in audit["retention"].items()
    ]
    return rows


def execution_figures(audit: dict) -> list[str]:
    e = audit["execution"]
    return [
        f"{'blocks executed':24s}{e['blocks_executed']:>6d}/{e['blocks_total']}",
        f"{'fraction executed':24s}{e['fraction_executed']:>10.3f}",
        f"{'controller calls':24s}{e['controller_calls']:>10d}",
        f"{'GFLOPs (one batch)':24s}{e['flops'] / 1e9:>10.2f}",
        f"{'latency (ms)':24s}{e['latency_ms']:>10.1f}",
        f"{'latency / ' + e.get('baseline', 'dense'):24s}{e['latency_ratio_vs_dense']:>10.2f}",
    ] + expert_figures(e) + positive_control_figures(e.get("positive_control"))


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
