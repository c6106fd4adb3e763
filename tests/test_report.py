"""The words of an audit: each verdict on either side of its threshold, with the figures it quotes; and
``audit-many``'s mean ± sd over seeds against ``statistics`` on the raw per-seed numbers."""

import functools
import statistics

import pytest

from fca_workbench.results.report import format_report
from fca_workbench.results.seeds import summarise
from fca_workbench.results.verdicts import STATIC_RETENTION, verdicts


def audit(retention=0.5, cross=(0.2, -0.1, 0.5), shuffle=(0.1, -0.2, 0.4), fraction=1.0, r2_layer=0.875):
    """A minimal audit dict: ``cross`` / ``shuffle`` are (ΔNLL, CI low, CI high)."""

    def condition(delta, lo, hi):
        return {"nll": 3.0 + delta, "ci95": [2.9 + delta, 3.1 + delta], "delta": delta, "delta_ci95": [lo, hi]}

    return {
        "model": {"path": "ckpt", "arch": "featuregate", "params": 1234},
        "data": {"eval": {"windows": 8, "window": 64, "source": "eval.txt"}},
        "conditions": {
            "correct": condition(0.0, 0.0, 0.0),
            "cross_input": condition(*cross),
            "token_shuffle": condition(*shuffle),
        },
        "retention": {
            "layer_mean": {
                "value": retention,
                "ci95": [None, None],
                "reference": "global_mean",
                "numerator": {"value": 0.5 * (retention or 0.0), "ci95": [0.0, 1.0]},
                "denominator": {"value": 0.5, "ci95": [0.3, 0.7] if retention is not None else [-0.1, 0.7]},
            }
        },
        "variance": {
            "r2_layer": r2_layer,
            "r2_layer_slot": 0.9,
            "r2_layer_slot_position": 0.95,
            "r2_layer_slot_window": 0.97,
        },
        "variation": {"within_std": 0.0123, "cv": 0.456},
        "execution": {
            "blocks_total": 8,
            "blocks_executed": round(8 * fraction),
            "fraction_executed": fraction,
            "controller_calls": 16,
            "flops": 2e9,
            "latency_ms": 5.0,
            "latency_ratio_vs_dense": 1.31,
        },
    }


def assignment(**figures):
    return verdicts(audit(**figures))["assignment_dependence"]


def staticness(**figures):
    return verdicts(audit(**figures))["staticness"]


def test_assignment_dependence_reads_only_the_reassignments_intervals():
    for retention in (0.2, 0.987, None):  # whatever the static profile retains
        text = assignment(retention=retention, cross=(0.3, 0.2, 0.4))
        assert text.startswith("The frozen model depends on which coefficients each input gets (cross_input: 95% CI")
        assert "cross_input +0.3000 nats [+0.2000, +0.4000]" in text and "retain" not in text
    for cross, shuffle in [((0.3, 0.01, 0.6), (0.1, -0.2, 0.4)), ((0.1, -0.2, 0.4), (0.3, 0.01, 0.6))]:
        assert assignment(cross=cross, shuffle=shuffle).startswith("The frozen model depends on")


def test_with_cis_including_zero_no_assignment_dependence_is_detected():
    text = assignment(retention=0.99, cross=(0.1, 0.0, 0.3), shuffle=(-0.1, -0.3, 0.1))
    assert text.startswith("No assignment dependence detected (every reassignment's 95% CI includes 0): ")
    assert "token_shuffle -0.1000 nats [-0.3000, +0.1000]" in text
    gains = assignment(cross=(-0.2, -0.3, -0.1), shuffle=(0.0, -0.1, 0.1))
    assert gains.startswith("Reassigning lowers the NLL (cross_input: 95% CI below 0)")


def test_causal_shuffle_counts_for_assignment_dependence():
    figures = audit(cross=(0.0, -0.1, 0.1), shuffle=(0.0, -0.1, 0.1))
    figures["conditions"]["causal_shuffle"] = {**figures["conditions"]["cross_input"], "delta": 0.2}
    figures["conditions"]["causal_shuffle"]["delta_ci95"] = [0.1, 0.3]
    assert verdicts(figures)["assignment_dependence"].startswith(
        "The frozen model depends on which coefficients each input gets (causal_shuffle: 95% CI above 0)"
    )


def test_staticness_reads_the_retention_with_its_reference_and_both_ends():
    assert STATIC_RETENTION == 0.95
    for retention in (0.95, 0.987, 1.2):
        text = staticness(retention=retention, cross=(0.0, -0.1, 0.1))  # whatever reassignment costs
        assert text.startswith("Largely static (the static profile keeps ≥ 95% of the gap): ")
        assert f"layer_mean retains {retention:.2%} of the global_mean-to-correct gap (+0.5000 nats" in text
    below = staticness(retention=0.9499, cross=(0.3, 0.2, 0.4))
    assert below.startswith("Not static: the static profile keeps less than 95% of the gap")
    assert "cross_input" not in below


def test_an_unresolved_gap_states_no_retention_and_no_controller_is_said_so():
    text = staticness(retention=None)
    assert text.startswith("Staticness not determined: the global_mean-to-correct gap")
    assert "does not resolve" in text and "%" not in text
    dense = audit()
    dense["conditions"] = {"unperturbed": dense["conditions"]["correct"]}
    dense["variation"] = dense["variance"] = None
    dense["retention"] = {}
    words = verdicts(dense)
    assert words["assignment_dependence"] == "No controller: there are no coefficients to reassign."
    assert words["coefficient_variation"] == "No controller: this model has no coefficients to vary."
    assert words["staticness"] == "No controller: there is no static profile to compare."


def test_variation_verdict_quotes_the_variance_shares():
    text = verdicts(audit(r2_layer=0.875))["coefficient_variation"]
    assert text == (
        "Coefficients vary (within-layer std 0.0123, CV 0.456); layer identity explains 87.5% of their "
        "variance, layer×slot 90.0%; adding position reaches 95.0%, adding the input window 97.0%."
    )
    assert verdicts(audit(r2_layer=None))["coefficient_variation"].startswith("Coefficients are constant")


def test_execution_verdict_tells_full_from_conditional_execution():
    full = verdicts(audit(fraction=1.0))["conditional_execution"]
    assert full.startswith("No conditional execution: every block ran for every token (8/8 block passes")
    assert "latency 1.31× the shape-matched Dense" in full
    partial = verdicts(audit(fraction=0.5))["conditional_execution"]
    assert partial.startswith("Conditional execution: fraction executed 0.500 (16 controller calls)")


def test_report_shows_the_verdicts_and_every_condition():
    report = audit(retention=0.99)
    report["verdict"] = verdicts(report)
    text = format_report(report, width=400)
    assert "Largely static" in text and "No conditional execution" in text
    assert "ret. layer_mean: layer_mean retains 99.00% of the global_mean-to-correct gap" in text
    assert all(f"\n{name} " in text for name in report["conditions"])


# ------------------------------------------------------------------------------------------------ over seeds


def test_summary_is_the_sample_mean_and_sd_of_the_per_seed_numbers():
    seeds = [
        audit(retention=r, r2_layer=q, cross=(c, c - 0.1, c + 0.1))
        for r, q, c in [(0.97, 0.8, 0.2), (0.91, 0.85, 0.25), (0.99, 0.9, 0.4)]
    ]
    summary = summarise(seeds)
    for path in (
        "retention.layer_mean.value",
        "variance.r2_layer",
        "conditions.cross_input.delta",
        "execution.latency_ratio_vs_dense",
    ):
        raw = [functools.reduce(dict.get, path.split("."), a) for a in seeds]
        assert summary[path]["values"] == raw
        assert summary[path]["mean"] == pytest.approx(sum(raw) / 3, rel=1e-12)
        assert summary[path]["sd"] == pytest.approx(statistics.stdev(raw), rel=1e-12)
    assert summarise(seeds[:1])["variance.r2_layer"]["sd"] == 0.0


def test_summary_keeps_only_the_numbers_every_audit_has():
    with_gap, without = audit(retention=0.9), audit(retention=None)
    summary = summarise([with_gap, without])
    assert "retention.layer_mean.value" not in summary and "conditions.correct.nll" in summary
    assert not any(path.endswith("ci95") for path in summary)  # lists are not figures
