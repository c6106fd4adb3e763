"""Plain-language verdicts of an ``audit.json``: the three properties, each turned from figures into a sentence.

The thresholds that turn figures into words are stated in the sentences themselves, so a reader can
disagree with a verdict using the numbers beside it. A verdict is never computed from a number that is not
finite: ``verdicts`` refuses the audit instead (``require_finite_figures``).
"""

import math

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import CROSS_INPUT, LAYER_MEAN, TOKEN_SHUFFLE

JUDGED = ("conditions", "retention", "variance", "variation", "execution", "per_layer")  # what the verdicts read


STATIC_RETENTION = 0.95  # a static profile retaining this much of the gap counts as "largely static"


def verdicts(audit: dict) -> dict:
    require_finite_figures(audit)
    return {
        "coefficient_variation": variation_verdict(audit),
        "assignment_dependence": assignment_verdict(audit),
        "conditional_execution": execution_verdict(audit),
    }


def require_finite_figures(audit: dict) -> None:
    """Refuse an audit any of whose figures is NaN or infinite, naming the first one: no sentence can judge it."""
    for section in JUDGED:
        path = non_finite(audit.get(section), section)
        if path is not None:
            raise UserError(f"audit figure {path} is not a finite number: no verdict is computed from it")


def non_finite(value: object, path: str) -> str | None:
    """The path of the first NaN or infinite number in ``value`` (nested dicts and lists), else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if not isinstance(value, (dict, list)):
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return next((found for key, item in items if (found := non_finite(item, f"{path}.{key}")) is not None), None)


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
    if CROSS_INPUT not in conditions:
        return "No controller: there are no coefficients to reassign."
    cross, shuffle, static = conditions[CROSS_INPUT], conditions[TOKEN_SHUFFLE], retention[LAYER_MEAN]
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
    rows = audit.get("per_layer") or []
    largest, significant = carrying_layers(rows)
    if largest is None:
        return ""
    delta = next(r["delta"] for r in rows if r["layer"] == largest and r["condition"] == CROSS_INPUT)
    listed = ", ".join(map(str, significant)) or "none"
    return (
        f" Per layer (each alone, the others correct): cross-input reassignment costs most at layer {largest} "
        f"({delta:+.4f} nats); layers whose cross-input 95% CI excludes 0: {listed}."
    )


BASELINES = {
    "dense": "the shape-matched Dense",
    "static_mixture": "the static mixture (every expert for every token)",
    "same_model": "the same model (no router: nothing a controller could skip)",
}


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


def carrying_layers(rows: list[dict], condition: str = CROSS_INPUT) -> tuple[int | None, list[int]]:
    """The layer with the largest ΔNLL under ``condition``, and the layers whose ΔNLL CI excludes 0."""
    chosen = [row for row in rows if row["condition"] == condition]
    if not chosen:
        return None, []
    largest = max(chosen, key=lambda row: row["delta"])["layer"]
    significant = [row["layer"] for row in chosen if row["delta_ci95"][0] > 0 or row["delta_ci95"][1] < 0]
    return largest, significant
