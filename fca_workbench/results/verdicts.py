"""Plain-language verdicts of an ``audit.json``: one sentence per property, each from its own figures only.

Coefficient variation from the variance decomposition; assignment dependence from the reassignments' ΔNLL intervals
(``cross_input``, ``token_shuffle``, ``causal_shuffle``) alone; staticness from the headline static profile's
retention with its reference (a router's: ``layer_mean_topk`` over the compute-matched ``random_topk``); conditional
execution from what ran. No verdict reads another property's figures.

The thresholds that turn figures into words are stated in the sentences themselves, so a reader can
disagree with a verdict using the numbers beside it. A verdict is never computed from a number that is not
finite: ``verdicts`` refuses the audit instead (``require_finite_figures``).
"""

import math

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import (
    CAUSAL_SHUFFLE,
    CROSS_INPUT,
    GLOBAL_MEAN,
    LAYER_MEAN,
    LAYER_MEAN_TOPK,
    TOKEN_SHUFFLE,
)

JUDGED = (
    "conditions",
    "retention",
    "variance",
    "variation",
    "execution",
    "per_layer",
    "per_controller",
)  # what the verdicts read


STATIC_RETENTION = 0.95  # a static profile retaining this much of the gap counts as "largely static"
REASSIGNED = (CROSS_INPUT, TOKEN_SHUFFLE, CAUSAL_SHUFFLE)  # what assignment dependence is judged from


def verdicts(audit: dict) -> dict:
    require_finite_figures(audit)
    return {
        "coefficient_variation": variation_verdict(audit),
        "assignment_dependence": assignment_verdict(audit),
        "staticness": staticness_verdict(audit),
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
    """Assignment dependence from the reassignments' paired 95% CIs alone: does the frozen model's NLL change when
    a window gets another window's coefficients, or its own at other positions?"""
    conditions = audit["conditions"]
    if CROSS_INPUT not in conditions:
        return "No controller: there are no coefficients to reassign."
    present = [name for name in REASSIGNED if name in conditions]
    costs = [name for name in present if conditions[name]["delta_ci95"][0] > 0]
    gains = [name for name in present if conditions[name]["delta_ci95"][1] < 0]
    penalties = "; ".join(
        f"{name} {c['delta']:+.4f} nats [{c['delta_ci95'][0]:+.4f}, {c['delta_ci95'][1]:+.4f}]"
        for name in present
        for c in [conditions[name]]
    )
    if costs:
        lead = f"The frozen model depends on which coefficients each input gets ({', '.join(costs)}: 95% CI above 0)"
    elif gains:
        lead = f"Reassigning lowers the NLL ({', '.join(gains)}: 95% CI below 0): no cost of reassignment detected"
    else:
        lead = "No assignment dependence detected (every reassignment's 95% CI includes 0)"
    return f"{lead}: {penalties}.{per_layer_sentence(audit)}"


def headline_retention(audit: dict) -> str | None:
    """The profile staticness is judged from: a router's top-k profile (over the compute-matched reference) where
    the audit has it, else the static layerwise profile; None without either."""
    retention = audit.get("retention") or {}
    return next((p for p in (LAYER_MEAN_TOPK, LAYER_MEAN) if p in retention), None)


def retention_phrase(profile: str, retention: dict) -> str:
    """A retention with both ends, as the verdict and the report say it; an unresolved one is no percentage."""
    reference = retention.get("reference", GLOBAL_MEAN)
    gap = retention.get("denominator")
    over = "" if gap is None else f" ({gap['value']:+.4f} nats [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}])"
    if retention["value"] is None:
        return f"the {reference}-to-correct gap{over} does not resolve: no retention of {profile} is stated"
    lo, hi = retention["ci95"]
    ci = "" if lo is None or hi is None else f" [{lo:.2%}, {hi:.2%}]"
    return f"{profile} retains {retention['value']:.2%}{ci} of the {reference}-to-correct gap{over}"


def staticness_verdict(audit: dict) -> str:
    """Staticness from the headline profile's retention with its reference (and, where it is over another
    reference, the all-expert one beside it): how much of what the live coefficients are worth a static profile
    keeps."""
    profile = headline_retention(audit)
    if profile is None:
        return "No controller: there is no static profile to compare."
    retention = audit["retention"][profile]
    said = retention_phrase(profile, retention)
    beside = (retention.get("other_references") or {}).get(GLOBAL_MEAN)
    also = "" if beside is None else f"; beside it, {retention_phrase(profile, beside)}"
    if retention["value"] is None:
        lead = "Staticness not determined"
    elif retention["value"] >= STATIC_RETENTION:
        lead = "Largely static (the static profile keeps ≥ 95% of the gap)"
    else:
        lead = "Not static: the static profile keeps less than 95% of the gap"
    return f"{lead}: {said}{also}."


def per_layer_sentence(audit: dict) -> str:
    """Which decoder layers carry the dependence, when the audit has a per-layer sweep (else nothing); where a
    layer holds several controllers, which one alone costs most."""
    rows = audit.get("per_layer") or []
    largest, significant = carrying_layers(rows)
    if largest is None:
        return ""
    delta = next(r["delta"] for r in rows if r["layer"] == largest and r["condition"] == CROSS_INPUT)
    listed = ", ".join(map(str, significant)) or "none"
    alone = [r for r in audit.get("per_controller") or [] if r["condition"] == CROSS_INPUT]
    most = max(alone, key=lambda row: row["delta"], default=None)
    controller = (
        ""
        if most is None
        else f" Of one controller alone, {most['controller']} (layer {most['layer']}) costs most ({most['delta']:+.4f} nats)."
    )
    return (
        f" Per decoder layer (its controllers together, the other layers correct): cross-input reassignment costs "
        f"most at layer {largest} ({delta:+.4f} nats); layers whose cross-input 95% CI excludes 0: {listed}.{controller}"
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
    """The decoder layer with the largest ΔNLL under ``condition``, and the layers whose ΔNLL CI excludes 0."""
    chosen = [row for row in rows if row["condition"] == condition]
    if not chosen:
        return None, []
    largest = max(chosen, key=lambda row: row["delta"])["layer"]
    significant = [row["layer"] for row in chosen if row["delta_ci95"][0] > 0 or row["delta_ci95"][1] < 0]
    return largest, significant
