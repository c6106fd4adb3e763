"""The notebooks: every one runs under papermill with tiny parameters and writes its table, and every number
in a table is the number in the audit.json of the same run.

All of them read the one tiny ``fca reproduce`` run of every notebook (``tiny_reproduce`` in conftest.py: tiny
random checkpoints of each family, a second FeatureGate seed and a tiny Mixtral, 4 windows of 64 tokens).
"""

import functools
import gzip
import math
import statistics

import nbformat
import pandas as pd
import pytest
import torch

from fca_workbench.audit.run import AuditSettings
from fca_workbench.explore import Explorer
from fca_workbench.notebooks import reproduce, tables
from fca_workbench.results.figures import STATIC_FORMATS, static_exporter
from fca_workbench.results.layout import STAGING_DIR

# Each test may be the first to need the shared papermill run (~2-5 min on a loaded 2-core machine): a hung
# kernel fails it after 20 min instead of eating CI's time.
pytestmark = pytest.mark.timeout(1200)

PLOTLY = "application/vnd.plotly.v1+json"
TABLES = {
    "01_variation": ["variation_per_model", "variation_over_seeds"],
    "02_assignment": ["assignment_per_model", "assignment_over_seeds"],
    "03_static_profiles": ["retention_per_model", "retention_over_seeds"],
    "04_execution": ["execution", "execution_over_seeds", "positive_control"],
    "05_muddpythia": ["muddpythia_penalties"],
    "06_per_layer": ["per_layer", "per_layer_over_seeds"],
    "07_training_dynamics": ["training_dynamics"],
    "08_downstream": ["downstream", "downstream_gaps"],
    "09_controller_design": ["controller_design_runs", "controller_design_over_seeds"],
    "10_router_design": [
        "router_design_runs",
        "router_design_over_seeds",
        "router_design_finetune",
        "router_design_finetune_runs",
    ],
    "explore": ["explore_window"],
}


@pytest.fixture(scope="module")
def tiny_run(tiny_reproduce):
    plan, results, audits, _ = tiny_reproduce
    return plan, results, audits


def rows(plan, name):
    """A written table's CSV cells as text, row by row (what a downstream script reads)."""
    frame = pd.read_csv(plan.out / "tables" / f"{name}.csv", dtype=str, keep_default_na=False)
    return frame.to_dict("records")


def number(text):
    return None if text == "" else float(text)


def over_seeds(audits, path):
    """(mean, sample sd) of one figure over the two FeatureGate seeds, straight from their audit.json numbers
    (None, None where a seed has no value)."""
    raw = [functools.reduce(dict.get, path.split("."), audits[name]) for name in ("featuregate-s0", "featuregate-s1")]
    if None in raw:
        return None, None
    return pytest.approx(statistics.fmean(raw), rel=1e-12), pytest.approx(statistics.stdev(raw), rel=1e-12)


def test_every_notebook_runs_and_writes_its_tables(tiny_run):
    plan, results, _ = tiny_run
    assert {name: r.ok for name, r in results.items()} == {name: True for name in TABLES}, {
        name: r.error for name, r in results.items()
    }
    for notebook, names in TABLES.items():
        executed = nbformat.read(plan.out / "notebooks" / f"{notebook}.ipynb", as_version=4)
        tags = [cell.metadata.get("tags", []) for cell in executed.cells]
        assert ["injected-parameters"] in tags  # papermill ran it with the run's parameters
        assert executed.metadata.kernelspec.name == reproduce.KERNEL_NAME
        for name in names:
            for ext in ("csv", "md", "tex"):
                assert (plan.out / "tables" / f"{name}.{ext}").stat().st_size > 0
            table = plan.out / "tables" / f"{name}.csv"
            assert [n for n, r in results.items() if table in r.files] == [notebook]  # two ran at once: its own only
    assert not (plan.out / STAGING_DIR).exists()  # every notebook's files moved out of its staging folder


def test_figures_are_offline_html_with_static_copies(tiny_run):
    """Every figure as offline HTML and, with a browser for plotly's exporter, as PDF, SVG and PNG; an executed
    notebook's figures carry that PNG beside plotly's JSON, so a reader without plotly.js still sees them."""
    plan, _, _ = tiny_run
    figures = {p.stem for p in (plan.out / "figures").glob("*.html")}
    assert {
        "variance_decomposition",
        "heatmap_featuregate-s0",
        "heatmap_muddpythia-s0",
        "heatmap_moe-s0",
        "assignment_delta_nll",
        "retention",
        "execution",
        "muddpythia_penalties",
        "explore_coefficients",
        "per_layer_heatmap",
    } <= figures
    assert (plan.out / "figures" / "plotly.min.js").is_file()
    html = (plan.out / "figures" / "heatmap_featuregate-s0.html").read_text()
    assert 'src="plotly.min.js"' in html and "cdn.plot.ly" not in html
    if not static_exporter():
        pytest.skip("no Chrome or Chromium for plotly's exporter: HTML only")
    for fmt in STATIC_FORMATS:
        assert {p.stem for p in (plan.out / "figures").glob(f"*.{fmt}")} == figures
    executed = nbformat.read(plan.out / "notebooks" / "02_assignment.ipynb", as_version=4)
    shown = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if PLOTLY in o.get("data", {})]
    assert shown and all("image/png" in o["data"] for o in shown)


def test_index_names_models_data_and_outputs(tiny_run):
    plan, _, _ = tiny_run
    index = (plan.out / "README.md").read_text()
    assert f"{len(TABLES)} of {len(TABLES)} notebooks passed" in index
    for name in (
        "featuregate-s0",
        "featuregate-s1",
        "dense-s0",
        "muddpythia-s0",
        "moe-s0",
        "eval.jsonl.gz",
        "max windows 4",
        "tables/retention_over_seeds.csv",
        "figures/heatmap_featuregate-s0.html",
        "notebooks/01_variation.ipynb",
    ):
        assert name in index


def test_variation_tables_equal_the_audits(tiny_run):
    plan, _, audits = tiny_run
    per_model = {r["model"]: r for r in rows(plan, "variation_per_model")}
    assert set(per_model) == {
        "featuregate-s0",
        "featuregate-s1",
        "muddpythia-s0",
        "moe-s0",
    }  # Dense has no coefficients
    for name, row in per_model.items():
        for key, path in tables.VARIANCE_PATHS.items():
            section, field = path.split(".")
            assert number(row[key]) == audits[name][section][field]
    seeds = {r["arch"]: r for r in rows(plan, "variation_over_seeds")}
    for key, path in tables.VARIANCE_PATHS.items():
        mean, sd = over_seeds(audits, path)
        assert number(seeds["featuregate"][f"{key}_mean"]) == mean
        assert number(seeds["featuregate"][f"{key}_sd"]) == sd
    assert seeds["featuregate"]["n"] == "2"


def test_assignment_tables_equal_the_audits(tiny_run):
    plan, _, audits = tiny_run
    table = rows(plan, "assignment_per_model")
    controlled = [audit for audit in audits.values() if audit["variation"] is not None]  # Dense: nothing to reassign
    assert len(table) == sum(len(audit["conditions"]) for audit in controlled)  # every such audit's every condition
    assert len(controlled) == len(audits) - 1
    assert [r["model"] for r in table if r["condition"] == "layer_mean_topk"] == ["moe-s0"]
    for row in table:
        figures = audits[row["model"]]["conditions"][row["condition"]]
        assert number(row["nll"]) == figures["nll"] and number(row["delta"]) == figures["delta"]
        assert [number(row["ci95_lo"]), number(row["ci95_hi"])] == figures["ci95"]
        assert [number(row["delta_ci95_lo"]), number(row["delta_ci95_hi"])] == figures["delta_ci95"]
    over = [row for row in rows(plan, "assignment_over_seeds") if row["arch"] == "featuregate"]
    assert len(over) == len(audits["featuregate-s0"]["conditions"])
    for row in over:
        mean, sd = over_seeds(audits, f"conditions.{row['condition']}.delta")
        assert number(row["delta_mean"]) == mean and number(row["delta_sd"]) == sd


def test_retention_tables_equal_the_audits(tiny_run):
    plan, _, audits = tiny_run
    for row in rows(plan, "retention_per_model"):
        for profile in tables.RETENTION_PROFILES:
            retention = audits[row["model"]]["retention"][profile]
            assert number(row[profile]) == retention["value"]
            assert [number(row[f"{profile}_ci95_lo"]), number(row[f"{profile}_ci95_hi"])] == retention["ci95"]
    main = {r["arch"]: r for r in rows(plan, "retention_over_seeds")}
    seeds = [audit for audit in audits.values() if audit["model"]["arch"] == "featuregate"]
    for profile in tables.RETENTION_PROFILES:  # over seeds: the ratio of the mean numerator to the mean denominator
        numerator = statistics.fmean(a["retention"][profile]["numerator"]["value"] for a in seeds)
        denominator = statistics.fmean(a["retention"][profile]["denominator"]["value"] for a in seeds)
        got = number(main["featuregate"][profile])
        assert got is None or got == pytest.approx(numerator / denominator, rel=1e-12)


def test_execution_tables_equal_the_audits_with_the_positive_control(tiny_run):
    plan, _, audits = tiny_run
    table = {r["model"]: r for r in rows(plan, "execution")}
    assert set(table) == set(audits)
    for name, audit in audits.items():
        for column in tables.EXECUTION_COLUMNS:
            assert number(table[name][column.key]) == audit["execution"].get(column.key)
        assert table[name]["baseline"] == audit["execution"]["baseline"]
    moe = table["moe-s0"]  # the row where conditional execution is real: top-2 of 4 experts, against every expert
    assert number(moe["expert_fraction_executed"]) == 2 / 4 and moe["baseline"] == "static_mixture"
    assert {table[name]["expert_fraction_executed"] for name in audits if name != "moe-s0"} == {""}
    controls = {r["model"]: r for r in rows(plan, "positive_control")}
    assert set(controls) == {"featuregate-s0", "featuregate-s1"}
    for name, row in controls.items():
        execution = audits[name]["execution"]
        for key in ("fraction_executed", "flops", "latency_ratio_vs_dense"):
            assert number(row[key]) == execution["positive_control"][key]
            assert number(row[f"own_{key}"]) == execution[key]
        assert number(row["fraction_executed"]) < 1.0 == number(row["own_fraction_executed"])


def test_muddpythia_table_equals_its_audit(tiny_run):
    plan, _, audits = tiny_run
    table = {r["condition"]: r for r in rows(plan, "muddpythia_penalties")}
    assert {r["model"] for r in rows(plan, "muddpythia_penalties")} == {"muddpythia-s0"}
    for condition in ("cross_input", "token_shuffle"):
        figures = audits["muddpythia-s0"]["conditions"][condition]
        assert number(table[condition]["delta"]) == figures["delta"]
        assert [number(table[condition]["delta_ci95_lo"]), number(table[condition]["delta_ci95_hi"])] == figures[
            "delta_ci95"
        ]


def test_per_layer_tables_equal_the_audits(tiny_run):
    plan, _, audits = tiny_run
    table = rows(plan, "per_layer")
    assert {r["model"] for r in table} == {
        "featuregate-s0",
        "featuregate-s1",
        "muddpythia-s0",
        "moe-s0",
    }  # reproduce sweeps
    for row in table:
        [figures] = [
            r
            for r in audits[row["model"]]["per_layer"]
            if r["layer"] == int(row["layer"]) and r["condition"] == row["condition"]
        ]
        assert number(row["nll"]) == figures["nll"] and number(row["delta"]) == figures["delta"]
        assert [number(row["delta_ci95_lo"]), number(row["delta_ci95_hi"])] == figures["delta_ci95"]
    assert len(table) == sum(len(a["per_layer"]) for a in audits.values())
    fg = [audits["featuregate-s0"], audits["featuregate-s1"]]
    seeds = [r for r in rows(plan, "per_layer_over_seeds") if r["arch"] == "featuregate"]
    assert len(seeds) == len(fg[0]["per_layer"])
    for row in seeds:
        deltas = [
            next(
                r["delta"]
                for r in a["per_layer"]
                if r["layer"] == int(row["layer"]) and r["condition"] == row["condition"]
            )
            for a in fg
        ]
        assert math.isclose(number(row["delta_mean"]), sum(deltas) / 2, rel_tol=1e-12)
        assert math.isclose(number(row["delta_sd"]), abs(deltas[0] - deltas[1]) / math.sqrt(2), rel_tol=1e-9)


def test_explore_window_matches_the_audits_per_token_nll(tiny_run):
    """The exploration notebook's per-token NLLs come from the same frozen replay as the audit's."""
    plan, _, _ = tiny_run
    table = rows(plan, "explore_window")
    with gzip.open(plan.out / "audits" / "featuregate-s0" / "per_token_nll.csv.gz", "rt") as handle:
        header, *lines = handle.read().splitlines()
    columns = header.split(",")
    audit_rows = [dict(zip(columns, line.split(","))) for line in lines if line.startswith("1,")]
    assert len(table) == len(audit_rows) == 63
    for mine, theirs in zip(table, audit_rows):
        assert mine["position"] == theirs["position"]
        assert math.isclose(float(mine["correct"]), float(theirs["correct"]), abs_tol=1e-4)
        assert math.isclose(float(mine["nll_condition"]), float(theirs["cross_input"]), abs_tol=1e-4)


def test_explore_replays_the_moe_through_the_protocol(tiny_run):
    """The explorer's per-token NLLs of the MoE (router outputs replayed whole, or a static gate) equal the
    audit's."""
    plan, _, audits = tiny_run
    fields = AuditSettings.__dataclass_fields__
    explorer = Explorer(AuditSettings(**{k: v for k, v in audits["moe-s0"]["settings"].items() if k in fields}))
    assert explorer.routers == [True, True] and "layer_mean_topk" in explorer.conditions
    assert tables.slot_labels(explorer.slot_shapes[0], explorer.arch, True) == [f"expert {e}" for e in range(4)]
    with gzip.open(plan.out / "audits" / "moe-s0" / "per_token_nll.csv.gz", "rt") as handle:
        frame = pd.read_csv(handle)
    window = frame[frame["window"] == 1]
    for condition in ("correct", "cross_input", "token_shuffle", "layer_mean", "layer_mean_topk"):
        nll = explorer.token_nll(condition, 1)
        assert len(nll) == len(window) == 63
        assert (nll - torch.tensor(window[condition].to_numpy())).abs().max() < 1e-5, condition


def test_training_dynamics_table_equals_the_shipped_audit_logs(tiny_run):
    from fca_workbench.training.training_audit import TRAINING_DYNAMICS_DIR

    plan, _, _ = tiny_run
    table = rows(plan, "training_dynamics")
    assert {r["run"] for r in table} == {p.parent.name for p in TRAINING_DYNAMICS_DIR.glob("*/audit_log.csv")} and table
    for row in table:
        log = pd.read_csv(TRAINING_DYNAMICS_DIR / row["run"] / "audit_log.csv").set_index("step").loc[int(row["step"])]
        for key in ("nll_correct", "delta_cross_input", "retention_layer_mean", "r2_layer"):
            assert number(row[key]) == log[key]
