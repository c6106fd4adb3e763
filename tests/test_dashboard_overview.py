"""The results view's overview and comparison: every number equals the audit.json files (read here, by hand)
and ``load_audits``; a broken audit leaves the others; what cannot be compared is refused in one line; and in a
real browser the table sorts, a row opens the detail, two audits compare, and the URL brings all of it back."""

import json
import math
import shutil
import statistics
import sys
import urllib.parse
from pathlib import Path

import pandas as pd
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, require_browser

from fca_workbench import load_audits
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import tables
from fca_workbench.viewmodel.compare import comparison
from fca_workbench.viewmodel.downloads import download_csv
from fca_workbench.viewmodel.results_folder import ResultsFolder
from fca_workbench.viewmodel.results_overview import chosen_sort, notebook_snippet, overview_of

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "data" / "checkpoints"
sys.path.insert(0, str(ROOT / "dashboards"))
AUDITED = ("featuregate-s0", "featuregate-s1", "dense-s0")


@pytest.fixture(scope="module")
def overview_root(tmp_path_factory):
    """Small audits of shipped checkpoints (4 windows of 64 tokens; the FeatureGates with a per-layer sweep),
    as ``fca audit`` lays them out, plus a copy of one audit (not another seed) and a truncated audit.json."""
    from fca_workbench.audit.run import AuditSettings, run_audit

    root = tmp_path_factory.mktemp("overview") / "results"
    for name in AUDITED:
        settings = AuditSettings(
            checkpoint=str(CHECKPOINTS / name),
            window=64,
            max_windows=4,
            resamples=100,
            latency_repeats=1,
            per_layer=name != "dense-s0",
        )
        run_audit(settings, root / f"audit-{name}")
    shutil.copytree(root / "audit-featuregate-s0", root / "copy-featuregate-s0", ignore=shutil.ignore_patterns("cache"))
    text = (root / "audit-dense-s0" / "audit.json").read_text()
    (root / "broken").mkdir()
    (root / "broken" / "audit.json").write_text(text[: len(text) // 3])
    return root


def raw(root: Path, name: str) -> dict:
    return json.loads((root / name / "audit.json").read_text())


VALID = ["audit-dense-s0", "audit-featuregate-s0", "audit-featuregate-s1", "copy-featuregate-s0"]


def test_overview_numbers_are_the_audit_files_and_load_audits(overview_root):
    overview = overview_of(ResultsFolder(overview_root).scan())
    assert overview.names == VALID  # the broken one is a note, the others all rows
    assert [name for name, _ in overview.problems] == ["broken"]
    assert "not a complete audit.json" in overview.problems[0][1] and "\n" not in overview.problems[0][1]
    rows = overview.table.set_index("audit")
    for name in VALID:
        audit, row = raw(overview_root, name), rows.loc[name]
        conditions = audit["conditions"]
        assert row["nll_correct"] == conditions.get("correct", conditions["unperturbed"])["nll"]
        assert row["eval_windows"] == 4 and row["params"] == audit["model"]["params"]
        assert row["latency_ratio_vs_dense"] == audit["execution"]["latency_ratio_vs_dense"]
        if audit["variance"] is None:  # Dense: no controller, nothing reassigned, no profile
            assert math.isnan(row["delta_cross_input"]) and pd.isna(row["best_profile"])
            assert row["verdict_assignment_dependence"] == "No controller"
            continue
        lo, hi = conditions["cross_input"]["delta_ci95"]
        assert (row["delta_cross_input"], row["delta_cross_input_ci95_lo"], row["delta_cross_input_ci95_hi"]) == (
            conditions["cross_input"]["delta"],
            lo,
            hi,
        )
        assert row["delta_token_shuffle"] == conditions["token_shuffle"]["delta"]
        values = {p: r["value"] for p, r in audit["retention"].items() if r["value"] is not None}
        best = max(values, key=values.get)
        assert (row["best_profile"], row["best_retention"]) == (best, values[best])
        assert row["r2_layer_slot"] == audit["variance"]["r2_layer_slot"]
        assert audit["verdict"]["coefficient_variation"].startswith(row["verdict_coefficient_variation"])
    # the DataFrame a notebook gets from the same folders is the same table, value for value
    notebook = load_audits([overview_root / name for name in VALID]).overview
    assert tables.to_csv(notebook) == tables.to_csv(overview.table)


def test_the_snippet_gives_the_table_the_csv_holds_wherever_it_runs(overview_root, monkeypatch, tmp_path):
    """Started above the results folder, the snippet's paths are relative to where the dashboard was started and
    say so; started elsewhere, they are absolute; run from that folder, or from any other when absolute, the
    snippet gives the table the download holds."""
    overview = overview_of(ResultsFolder(overview_root).scan())
    started = overview_root.parent.parent
    relative = notebook_snippet(overview_root, overview.names, start=started)
    assert f"# paths relative to {started}" in relative and f"'{overview_root.parent.name}/results/" in relative
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    absolute = notebook_snippet(overview_root, overview.names, start=elsewhere)
    assert "# absolute paths" in absolute and f"'{overview_root}/audit-dense-s0'" in absolute
    for snippet, runs_in in ((relative, started), (absolute, elsewhere)):
        monkeypatch.chdir(runs_in)
        scope: dict = {}
        exec(snippet, scope)
        assert download_csv(scope["audits"].overview) == overview.csv("audit", "ascending")


def test_figures_across_audits_are_mean_and_sd_over_distinct_seeds(overview_root):
    overview = overview_of(ResultsFolder(overview_root).scan())
    seeds = [raw(overview_root, f"audit-featuregate-s{i}") for i in (0, 1)]  # the copy is not a third seed
    retention = {b.arch: b for b in overview.retention_bars()}
    assert list(retention) == ["featuregate"] and retention["featuregate"].n == 2
    bars = retention["featuregate"]
    for profile, value, low, high in zip(bars.x, bars.mean, bars.low, bars.high):
        ends = [seed["retention"][profile] for seed in seeds]  # a ratio of means, not a mean of ratios
        expected = sum(e["numerator"]["value"] for e in ends) / sum(e["denominator"]["value"] for e in ends)
        assert value == pytest.approx(expected, rel=1e-12) and low <= value <= high
    delta = {b.arch: b for b in overview.delta_bars()}["featuregate"]
    assert "correct" not in delta.x and "cross_input" in delta.x
    i = delta.x.index("cross_input")
    assert delta.mean[i] == pytest.approx(statistics.fmean(a["conditions"]["cross_input"]["delta"] for a in seeds))


def test_sorting_and_links(overview_root):
    overview = overview_of(ResultsFolder(overview_root).scan())
    ordered = overview.sorted("delta_cross_input", "descending")
    deltas = {n: raw(overview_root, n)["conditions"].get("cross_input", {}).get("delta") for n in VALID}
    expected = sorted((n for n in VALID if deltas[n] is not None), key=lambda n: -deltas[n]) + ["audit-dense-s0"]
    assert list(ordered["audit"]) == expected  # missing values last
    assert chosen_sort({"sort": "r2_layer", "order": "descending"}) == (("r2_layer", "descending"), [])
    (key, order), notes = chosen_sort({"sort": "<script>", "order": "up"})
    assert (key, order) == ("audit", "ascending") and len(notes) == 2 and "sort='<script>'" in notes[0]


def test_two_audits_side_by_side_and_what_cannot_be_compared(overview_root, tmp_path):
    a, b = raw(overview_root, "audit-featuregate-s0"), raw(overview_root, "audit-featuregate-s1")
    made = comparison(a, b, ("s0", "s1"))
    assert any(d.startswith("different models") for d in made.differences)
    assert not any("eval windows" in d for d in made.differences)  # the same windows of the same text
    conditions = {t.attrs["name"]: t for t in made.tables}["compare_conditions"].set_index("condition")
    for name in ("cross_input", "layer_mean"):
        assert conditions.loc[name, "difference"] == b["conditions"][name]["delta"] - a["conditions"][name]["delta"]
    per_layer = {t.attrs["name"]: t for t in made.tables}["compare_per_layer"]
    assert len(per_layer) == len(a["per_layer"]) and made.per_layer is not None
    same = comparison(a, raw(overview_root, "copy-featuregate-s0"), ("s0", "copy"))
    assert same.differences == ["the same model (fingerprints match)"]
    with pytest.raises(UserError, match="pick two different audits"):
        comparison(a, a, ("s0", "s0"))
    longer = json.loads(json.dumps(b))
    longer["data"]["eval"]["window"] = 128
    with pytest.raises(UserError, match="windows of 64 tokens, s1 of 128"):
        comparison(a, longer, ("s0", "s1"))
    retokenized = json.loads(json.dumps(b))
    retokenized["data"]["eval"]["fingerprint"] = "0" * 64
    with pytest.raises(UserError, match="different tokenizers"):
        comparison(a, retokenized, ("s0", "s1"))
    elsewhere = json.loads(json.dumps(retokenized))
    elsewhere["data"]["eval"]["source"] = "/somewhere/else/wiki.txt"  # one model on two eval sets: said, not refused
    assert any("wiki.txt" in d and "different text" in d for d in comparison(a, elsewhere, ("s0", "s1")).differences)


# ------------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def served_overview(overview_root, tmp_path_factory):
    from test_dashboard import dashboard_server

    require_browser()
    root = tmp_path_factory.mktemp("overview-server")
    registry = {"featuregate-s0": str(CHECKPOINTS / "featuregate-s0")}
    with dashboard_server(root, registry, "--results", str(overview_root)) as served:
        yield served


def _query(page) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.url).query))


def _opened(browser, url: str):
    page = browser.new_page(viewport={"width": 1500, "height": 1600}, accept_downloads=True)
    page.goto(url, timeout=120_000)
    page.wait_for_selector(".fca-overview .tabulator-row", timeout=120_000)
    return page


def _rows(page) -> list[str]:
    """The overview's first column (audit) in the order shown."""
    return page.locator(".fca-overview .tabulator-row .tabulator-cell[tabulator-field='audit']").all_inner_texts()


@pytest.mark.timeout(900)
def test_overview_in_a_real_browser(served_overview, overview_root):
    from playwright.sync_api import sync_playwright
    from test_dashboard import assert_quiet

    url, server_log = served_overview
    overview = overview_of(ResultsFolder(overview_root).scan())
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = _opened(browser, url + "?view=results")
            assert _rows(page) == VALID
            assert not page.locator(".fca-results-title").count()  # the overview first, no audit in detail
            problems = page.locator(".fca-results-problem").all()
            assert [p.get_attribute("data-entry") for p in problems] == ["broken"]
            page.locator(".fca-sort select").select_option(label="ΔNLL cross_input")
            page.locator(".fca-order .bk-btn", has_text="descending").click()
            expected = list(overview.sorted("delta_cross_input", "descending")["audit"])
            page.wait_for_function("() => location.search.includes('order=descending')", timeout=30_000)
            page.wait_for_timeout(500)
            assert _rows(page) == expected
            with page.expect_download(timeout=60_000) as download:
                page.locator(".fca-download-overview button, .fca-download-overview a").first.click()
            assert Path(download.value.path()).read_text() == overview.csv("delta_cross_input", "descending")
            page.locator(".fca-overview .tabulator-row").nth(expected.index("audit-featuregate-s1")).click()
            page.wait_for_selector(".fca-results-title", timeout=60_000)
            assert page.locator(".fca-results-title").inner_text() == "audit-featuregate-s1"
            page.locator(".fca-compare-with select").select_option(
                label="audit-featuregate-s0 (featuregate-s0, featuregate)"
            )
            page.wait_for_selector(".fca-compare-title", timeout=60_000)
            assert "different models" in " ".join(page.locator(".fca-compare-difference").all_inner_texts())
            page.wait_for_function("() => location.search.includes('compare=audit-featuregate-s0')", timeout=30_000)
            query = _query(page)
            assert {k: query.get(k) for k in ("view", "audit", "compare", "sort", "order")} == {
                "view": "results",
                "audit": "audit-featuregate-s1",
                "compare": "audit-featuregate-s0",
                "sort": "delta_cross_input",
                "order": "descending",
            }
            page.screenshot(path=str(overview_root.parent / "overview.png"), full_page=True)
            again = _opened(browser, page.url)  # the link, opened elsewhere: the same view
            assert _rows(again) == expected
            again.wait_for_selector(".fca-compare-title", timeout=60_000)
            assert again.locator(".fca-results-title").inner_text() == "audit-featuregate-s1"
            assert again.locator(".fca-compare-title").inner_text() == "audit-featuregate-s1 vs audit-featuregate-s0"
        finally:
            browser.close()
    assert_quiet(server_log)


def test_compare_notes_different_latency_baselines_and_gives_flops_in_gflop(overview_root):
    a, b = raw(overview_root, "audit-featuregate-s0"), raw(overview_root, "audit-featuregate-s1")
    assert not any("latency baselines" in d for d in comparison(a, b, ("s0", "s1")).differences)
    mixture = json.loads(json.dumps(b))
    mixture["execution"]["baseline"] = "static_mixture"
    made = comparison(a, mixture, ("s0", "s1"))
    (note,) = [d for d in made.differences if "latency baselines" in d]
    assert "s0 against a shape-matched Dense" in note and "s1 against the static mixture" in note
    figures = {t.attrs["name"]: t for t in made.tables}["compare_figures"].set_index("figure")
    flops = figures.loc["GFLOP (one batch)"]
    assert flops["first"] == a["execution"]["flops"] / 1e9 and flops["second"] == b["execution"]["flops"] / 1e9
    readable = tables.readable(figures.reset_index().set_axis(["figure", *figures.columns], axis=1))
    assert readable.iloc[list(figures.index).index("GFLOP (one batch)"), 1] == f"{a['execution']['flops'] / 1e9:.4f}"


def test_the_retention_chart_shows_every_profile_an_architectures_audits_have(overview_root):
    """A router's audits add ``layer_mean_topk``: its bars show it beside the profiles every controller has."""
    audits = [raw(overview_root, f"audit-featuregate-s{i}") for i in (0, 1)]
    routed = json.loads(json.dumps(audits[0]))
    routed["model"] = {**routed["model"], "arch": "mixtral", "fingerprint": "1" * 64}
    routed["retention"]["layer_mean_topk"] = {"value": 0.25, "ci95": [0.2, 0.3]}
    from fca_workbench.viewmodel.results_overview import Overview

    bars = {b.arch: b for b in Overview(pd.DataFrame(), [], [*audits, routed]).retention_bars()}
    shown = bars["mixtral"].x
    assert (
        set(shown) == {*bars["featuregate"].x, "layer_mean_topk"}
        and bars["mixtral"].mean[shown.index("layer_mean_topk")] == 0.25
    )
    assert "layer_mean_topk" not in bars["featuregate"].x
