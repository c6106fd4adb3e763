"""Downstream gaps with their errors (``downstream.clustered``, ``downstream.gaps``): the clustered standard error
against a hand computation, the retention's interval, and no percentage from a gap that does not resolve."""

import json
import math

import pytest

from fca_workbench.downstream.clustered import clustered_mean, clustered_ratio, critical
from fca_workbench.downstream.gaps import gap, resolved, retention
from fca_workbench.downstream.table import downstream_table, format_downstream, gap_table
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.frames import DOWNSTREAM_SCHEMA, OLDER_DOWNSTREAM_SCHEMAS, check_downstream
from fca_workbench.results.outputs import refuse_foreign

T2, T3 = 4.302652729911275, 3.182446305284263  # Student t 0.975 quantiles, 2 and 3 df (scipy.stats.t.ppf)


def figure(docs: list[float]) -> dict:
    return {"value": sum(docs) / len(docs), "stderr": 0.1, "documents": dict(enumerate(docs))}


def test_the_clustered_standard_error_equals_a_hand_computation():
    """d = [1, 0, 1, 1, 0, -1] in clusters a a b b b c: mean 1/3; cluster residual sums 1/3, 1, -4/3; CR1 variance
    3/2 · (1/9 + 1 + 16/9) / 6² = 13/108; the interval on t(2)."""
    d, clusters = [1.0, 0.0, 1.0, 1.0, 0.0, -1.0], ["a", "a", "b", "b", "b", "c"]
    got = clustered_mean(d, clusters)
    se = math.sqrt(13 / 108)
    assert got["value"] == pytest.approx(1 / 3) and got["stderr"] == pytest.approx(se)
    assert got["clusters"] == 3 and got["df"] == 2
    assert got["ci95"] == pytest.approx([1 / 3 - T2 * se, 1 / 3 + T2 * se])
    assert critical(3) == pytest.approx(T2, abs=1e-9) and critical(4) == pytest.approx(T3, abs=1e-9)


def test_one_document_per_cluster_is_lm_evals_paired_error_and_one_cluster_gives_none():
    d = [1.0, 0.0, 1.0, 1.0, 0.0, -1.0]
    assert clustered_mean(d, list(range(6)))["stderr"] == pytest.approx(
        math.sqrt(sum((x - 1 / 3) ** 2 for x in d) / 5) / math.sqrt(6)
    )
    single = clustered_mean(d, ["a"] * 6)
    assert single["stderr"] is None and single["ci95"] == [None, None] and single["df"] is None


def test_the_gap_is_paired_and_clustered_where_the_documents_allow():
    correct, low = figure([1, 1, 1, 1, 0, 0]), figure([0, 1, 0, 0, 0, 1])
    clusters = dict(enumerate(["a", "a", "b", "b", "b", "c"]))
    g = gap(correct, low, clusters)
    assert g["paired"] and g["clusters"] == 3 and g["stderr"] == pytest.approx(math.sqrt(13 / 108))
    assert not resolved(g)  # 1/3 − 4.30 × 0.347 < 0: three plays pin down little
    unpaired = gap({**correct, "documents": None}, low, clusters)
    assert not unpaired["paired"] and unpaired["clusters"] is None
    assert unpaired["stderr"] == pytest.approx(math.hypot(0.1, 0.1))
    assert gap(correct, {**low, "value": 0.9}, clusters)["paired"] is False  # a metric that is not the docs' mean


def test_retention_has_both_ends_and_a_delta_method_interval():
    """c = 1111 1110, r = 0010 0100, p = 1011 0110 in clusters aa bb cc dd: R = 3/5; the denominator's CR1 stderr
    1/8 (resolved: 0.625 − 3.18/8 > 0); the ratio's residuals a − R b by cluster −0.2, 0.4, −0.6, 0.4, so
    Var R = 4/3 · 0.72 / 5²."""
    c, r, p = figure([1, 1, 1, 1, 1, 1, 1, 0]), figure([0, 0, 1, 0, 0, 1, 0, 0]), figure([1, 0, 1, 1, 0, 1, 1, 0])
    clusters = dict(enumerate("aabbccdd"))
    kept = retention(p, c, r, "random_topk", clusters)
    assert kept["resolved"] and kept["reference"] == "random_topk" and kept["value"] == pytest.approx(0.6)
    assert kept["denominator"]["value"] == pytest.approx(5 / 8) and kept["denominator"]["stderr"] == pytest.approx(
        1 / 8
    )
    assert kept["numerator"]["value"] == pytest.approx(3 / 8)
    se = math.sqrt(4 / 3 * 0.72 / 25)
    assert kept["ci95"] == pytest.approx([0.6 - T3 * se, 0.6 + T3 * se])
    assert clustered_ratio([1, 0], [0, 0], ["a", "b"])["value"] is None  # no denominator, no ratio


def test_an_unresolved_gap_gives_no_retention_and_prints_no_percentage():
    c, r, p = figure([1, 1, 0, 1, 0, 1, 0, 0]), figure([1, 0, 1, 1, 0, 0, 1, 0]), figure([1, 1, 1, 1, 0, 0, 0, 0])
    clusters = dict(enumerate("aabbccdd"))
    kept = retention(p, c, r, "global_mean", clusters)
    assert not kept["resolved"] and kept["value"] is None and kept["ci95"] == [None, None]
    assert kept["numerator"]["value"] == pytest.approx(0.0) and kept["denominator"]["value"] == 0  # both ends kept
    downstream = {
        "model": {"path": "m", "hub": None, "arch": "mixtral", "fingerprint": "0" * 64},
        "settings": {"lm_eval": "0.4.13"},
        "tasks": {
            "t": {
                "samples": 8,
                "clusters": {"field": "play", "count": 4},
                "conditions": {
                    "correct": {"acc": {"value": 0.5, "stderr": 0.1, "gap": None, "retention": None}},
                    "global_mean": {
                        "acc": {"value": 0.5, "stderr": 0.1, "gap": gap(c, r, clusters), "retention": None}
                    },
                    "layer_mean": {"acc": {"value": 0.5, "stderr": 0.1, "gap": gap(c, p, clusters), "retention": kept}},
                },
            }
        },
    }
    printed = format_downstream(downstream)
    (line,) = [line for line in printed.splitlines() if "layer_mean" in line]
    assert "unresolved" in line and "%" not in line and "4 clusters by play" in printed
    table = downstream_table([downstream])
    assert table.retention.isna().all() and table.reference.tolist()[2] == "global_mean"
    gaps = gap_table([downstream])
    assert gaps.resolved.tolist() == ["no", "no"]
    assert gaps[["ci95_lo", "ci95_hi"]].values.tolist() == [gap(c, r, clusters)["ci95"], gap(c, p, clusters)["ci95"]]


def test_the_tables_carry_each_interval():
    c, r, p = figure([1, 1, 1, 1, 1, 1, 1, 0]), figure([0, 0, 1, 0, 0, 1, 0, 0]), figure([1, 0, 1, 1, 0, 1, 1, 0])
    clusters = dict(enumerate("aabbccdd"))
    kept = retention(p, c, r, "global_mean", clusters)
    row = {"value": p["value"], "stderr": 0.1, "gap": gap(c, p, clusters), "retention": kept}
    downstream = {
        "model": {"path": "m", "hub": None, "arch": "featuregate", "fingerprint": "0" * 64},
        "tasks": {
            "t": {"samples": 8, "clusters": {"field": "play", "count": 4}, "conditions": {"layer_mean": {"acc": row}}}
        },
    }
    table = downstream_table([downstream])
    assert table[["retention_ci95_lo", "retention_ci95_hi"]].values.tolist() == [pytest.approx(kept["ci95"])]
    assert table.reference.tolist() == ["global_mean"] and table.numerator.tolist() == [pytest.approx(3 / 8)]
    assert gap_table([downstream])[["ci95_lo", "ci95_hi"]].values.tolist() == [pytest.approx(row["gap"]["ci95"])]


def test_an_older_downstream_json_is_refused_in_one_line_and_fca_eval_may_replace_it(tmp_path):
    """``fca-downstream/1`` (no clustered errors; a router's retention against global_mean) is not read as /2: one
    line that says to rerun fca eval, which writes over it (a file of no fca schema is still refused)."""
    path = tmp_path / "downstream.json"
    path.write_text(json.dumps({"schema": "fca-downstream/1", "tasks": {}}))
    with pytest.raises(UserError, match="older fca eval.*rerun fca eval") as refused:
        check_downstream(json.loads(path.read_text()), path)
    assert "\n" not in str(refused.value)
    refuse_foreign(path, DOWNSTREAM_SCHEMA, older=OLDER_DOWNSTREAM_SCHEMAS)  # fca eval may replace it
    path.write_text(json.dumps({"schema": "something-else/1"}))
    with pytest.raises(UserError, match="is not a fca-downstream/2 file"):
        refuse_foreign(path, DOWNSTREAM_SCHEMA, older=OLDER_DOWNSTREAM_SCHEMAS)
