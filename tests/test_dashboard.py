"""The dashboard: its view model (unit tests, no server) and the served app in a real browser.

The browser test starts ``fca dashboard`` on a free localhost port in a subprocess, drives Debian's Chromium
(``/usr/bin/chromium``, headless) with Playwright, and saves screenshots to ``artifacts/screenshots/``.
``scripts/setup.sh`` installs Chromium where it is missing; without it the browser test fails under CI and
is skipped elsewhere.
"""

import gc
import html
import http.cookiejar
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import CHROMIUM, CHROMIUM_ARGS, free_port, require_browser, serving

from fca_workbench.audit.interventions import derangement, position_permutations, restrict_to, shuffle_positions
from fca_workbench.audit.session import DERANGEMENTS_KEPT
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import next_token_nll
from fca_workbench.results.conditions import BASELINES
from fca_workbench.viewmodel import (
    MAX_PASTE_CHARS,
    DashboardSession,
    ModelPool,
    Registry,
    SessionLimit,
    SharedModel,
    load_registry,
    pasted_input,
    window_input,
)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
sys.path.insert(0, str(ROOT / "dashboards"))


@pytest.fixture(scope="module")
def shared_models(tiny_checkpoints):
    return {
        arch: SharedModel(folder, calibration_windows=8, eval_windows=6) for arch, folder in tiny_checkpoints.items()
    }


# ------------------------------------------------------------------------------------------------ registry


def test_registry_file_resolves_relative_folders_and_refuses_unknown_names(tmp_path):
    (tmp_path / "ckpt" / "a").mkdir(parents=True)  # a folder wins over the hub name it also spells
    (tmp_path / "reg.json").write_text(json.dumps({"a": "ckpt/a", "b": "/abs/b"}))
    registry = Registry.from_file(tmp_path / "reg.json")
    assert registry.names == ["a", "b"]
    assert registry.folder("a") == (tmp_path / "ckpt" / "a").resolve()
    with pytest.raises(UserError, match="unknown checkpoint '../etc'"):
        registry.folder("../etc")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="bad.json is not valid JSON"):
        Registry.from_file(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(UserError, match="non-empty"):
        load_registry(tmp_path / "empty.json")


def test_fca_dashboard_reports_a_bad_registry_in_one_line(tmp_path, capsys):
    from fca_workbench.cli import main

    assert main(["dashboard", "--registry", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.strip() == f"fca: error: registry file not found: {tmp_path / 'missing.json'}"


def test_shipped_registry_lists_only_finished_checkpoints(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "config.json").write_text("{}")
    (tmp_path / "done" / "model.safetensors").write_bytes(b"")
    (tmp_path / "training").mkdir()  # no config or weights yet
    assert Registry.shipped(tmp_path).names == ["done"]


# ------------------------------------------------------------------------------------------------ inputs


def test_pasted_text_is_validated(shared_models):
    model = shared_models["featuregate"]
    for text, message in [
        ("", "empty"),
        ("   \n", "empty"),
        ("x" * (MAX_PASTE_CHARS + 1), "limit"),
        ("abc\x00def", "not plain text"),
        (b"bytes", "not text"),
        (None, "not text"),
    ]:
        with pytest.raises(UserError, match=message):
            pasted_input(model, text)
    long = pasted_input(model, "To be, or not to be, that is the question. " * 60)
    assert long.ids.shape == (1, model.window) and "only the first" in long.note
    short = pasted_input(model, "<script>alert(1)</script>\ttab")
    assert short.window_index is None and short.ids.shape[1] >= 2


def test_window_index_is_validated(shared_models):
    model = shared_models["featuregate"]
    for index in (-1, 6, "0", 1.5, True):
        with pytest.raises(UserError, match="does not exist"):
            window_input(model, index)
    assert torch.equal(window_input(model, 2).ids[0], model.eval_windows[2])


# ------------------------------------------------------------------------------------------------ analysis


def test_correct_and_unperturbed_have_zero_delta(shared_models, arch):
    model = shared_models[arch]
    session = DashboardSession()
    text = window_input(model, 0)
    for condition in ("correct", "unperturbed"):
        analysis = session.analyse(arch, model, text, condition)
        assert np.array_equal(analysis.delta, np.zeros_like(analysis.delta))
    if arch == "dense":
        analysis = session.analyse(arch, model, text, "token_shuffle", layer=0)
        assert analysis.coefficients_correct == [] and "no controller" in analysis.notes[-1]
        assert not analysis.delta.any()


def test_layer_intervention_matches_a_full_frozen_forward(shared_models, arch):
    if arch == "dense":
        pytest.skip("no coefficients")
    model = shared_models[arch]
    session = DashboardSession()
    text = window_input(model, 1)
    layer = 1
    analysis = session.analyse(arch, model, text, "token_shuffle", layer=layer, seed=3)
    with torch.no_grad():
        own = model.model(text.ids, return_coefficients=True).coefficients
        shuffled = shuffle_positions(own, position_permutations(torch.tensor([1]), text.ids.shape[1], 3))
        logits = model.model(text.ids, coefficients=restrict_to(shuffled, own, [layer])).logits
    assert np.array_equal(analysis.nll_condition, next_token_nll(logits, text.ids)[0].double().numpy())
    assert analysis.start_layer == model.model.resume_layer(layer)
    original, intervened, diff = analysis.slot_position(layer)
    assert diff.any() and np.array_equal(intervened - original, diff)
    grid = analysis.layer_position(analysis.all_slot_labels()[0])[2]
    assert np.nanmax(np.abs(np.delete(grid, layer, axis=0))) == 0  # the other layers keep their coefficients


def test_every_condition_with_donor_seed_and_retention(shared_models, arch):
    if arch == "dense":
        pytest.skip("no coefficients")
    model = shared_models[arch]
    session = DashboardSession()
    text = window_input(model, 0)
    audit_donor = session.analyse(arch, model, text, "cross_input", seed=0)
    assert audit_donor.donor == model.donor_for(0, 0) != 0
    picked = session.analyse(arch, model, text, "cross_input", donor=4)
    assert picked.donor == 4 and np.array_equal(picked.coefficients_condition[0], _flat_window(model, 4)[0])
    for profile in ("layer_scalar", "layer_mean", "layer_position_mean"):
        analysis = session.analyse(arch, model, text, profile, layer=None)
        gm, p, c = analysis.nll_global_mean, analysis.nll_condition.mean(), analysis.nll_correct.mean()
        if analysis.retention is not None:  # its gap resolves over the text's tokens
            assert analysis.retention == pytest.approx((gm - p) / (gm - c), rel=1e-9)
        else:  # a gap that does not resolve is no retention, and a note says so
            assert any(n.startswith("no retention:") for n in analysis.notes)
    pasted = session.analyse(arch, model, pasted_input(model, "Good night, sweet prince."), "cross_input", layer=0)
    assert len(pasted.tokens) == len(pasted.coefficients_condition[0])
    with pytest.raises(UserError, match="unknown intervention"):
        session.analyse(arch, model, text, "bogus")
    with pytest.raises(UserError, match="decoder layer 9 holds no controller"):
        session.analyse(arch, model, text, "correct", layer=9)
    with pytest.raises(UserError, match="does not exist"):
        session.analyse(arch, model, text, "cross_input", donor=99)


def _flat_window(model, index):
    with torch.no_grad():
        coefficients = model.model(model.eval_windows[index : index + 1], return_coefficients=True).coefficients
    return [c[0].reshape(c.shape[1], -1).numpy() for c in coefficients]


@pytest.fixture(scope="module")
def moe_model(tiny_mixtral):
    return SharedModel(tiny_mixtral, calibration_windows=8, eval_windows=6)


def test_moe_every_condition_replays_through_the_protocol(moe_model):
    """A foreign model's replay at one layer resumes at its decoder layer; every replay, one layer or all,
    equals the protocol's full frozen forward with the window's own cached router outputs elsewhere, computed
    here independently."""
    from fca_workbench.adapters import COEFFICIENT
    from fca_workbench.data.corpus import split_path
    from fca_workbench.data.windows import load_windows

    model, session, controlled = moe_model, DashboardSession(), moe_model.model
    assert "layer_mean_topk" in model.conditions and model.site_choices == {"layer 0": 0, "layer 1": 1}
    assert model.all_slot_labels() == ["expert 0", "expert 1", "expert 2", "expert 3"]
    text = window_input(model, 1)
    length = text.ids.shape[1]
    with torch.no_grad():
        live = next_token_nll(controlled(text.ids).logits, text.ids)[0].double().numpy()
        _, own = controlled.capture_run(text.ids)
        _, donor = controlled.capture_run(model.eval_windows[[model.donor_for(1, 3)]])
        calibration = load_windows(split_path("calibration"), model.tokenizer, model.window, 8)
        gates = [v[COEFFICIENT] for v in controlled.capture_run(calibration)[1]]
    means = [g.double().mean(dim=(0, 1)) for g in gates]
    top = [torch.zeros(4, dtype=torch.float64).scatter(0, m.topk(2).indices, m.topk(2).values) for m in means]
    profiles = {"layer_mean": means, "layer_mean_topk": [t / t.sum() for t in top]}  # Mixtral renormalises top-k
    permutations = position_permutations(torch.tensor([1]), length, 3)
    assigned = {
        "correct": own,
        "cross_input": donor,
        "token_shuffle": [{k: shuffle_positions([t], permutations)[0] for k, t in v.items()} for v in own],
        **{
            name: [{COEFFICIENT: p.float().expand(1, length, 4)} for p in profile] for name, profile in profiles.items()
        },
    }
    for condition in model.conditions:
        for layer in (None, 1):
            analysis = session.analyse("moe", model, text, condition, layer=layer, seed=3)
            assert np.array_equal(analysis.nll_correct, live)
            assert analysis.start_layer == (0 if layer is None else controlled.resume_layer(layer))
            gate = analysis.coefficients_correct[0]  # the heatmaps show the dense gate: slot = expert
            assert gate.shape == (length, 4) and ((gate > 0).sum(1) == 2).all()
            if condition in ("unperturbed", "correct"):
                assert np.array_equal(analysis.nll_condition, live), condition
                continue
            assert np.isfinite(analysis.nll_condition).all() and analysis.delta.any(), (condition, layer)
            if condition not in assigned:
                continue
            values = assigned[condition] if layer is None else restrict_to(assigned[condition], own, [layer])
            with torch.no_grad():
                expected = next_token_nll(controlled.replay_run(text.ids, values), text.ids)[0].double().numpy()
            if condition in ("cross_input", "token_shuffle"):  # moved whole: the same forward, bit for bit
                assert np.array_equal(analysis.nll_condition, expected), (condition, layer)
            np.testing.assert_allclose(
                analysis.nll_condition, expected, rtol=0, atol=1e-5, err_msg=f"{condition} {layer}"
            )
            if layer is not None:
                assert np.array_equal(analysis.coefficients_condition[0], gate)  # layer 0 keeps its own gate


def test_session_memory_is_bounded_and_freed(shared_models):
    model = shared_models["featuregate"]
    session = DashboardSession(max_windows=2, max_results=3)
    for index in range(5):
        session.analyse("fg", model, window_input(model, index), "token_shuffle", layer=0, seed=index)
    assert len(session.replays) == 2 and len(session.results) == 3
    assert session.replays.nbytes > 0
    session.close()
    assert len(session.replays) == 0 and not session.results


def test_derangements_are_kept_for_a_bounded_number_of_seeds(shared_models):
    model = shared_models["featuregate"]
    session = DashboardSession()
    text = window_input(model, 1)
    for seed in range(3 * DERANGEMENTS_KEPT):  # the Seed box stepped through many seeds
        model.donor_for(1, seed)
    for seed in range(3):
        session.analyse("fg", model, text, "cross_input", layer=0, seed=10_000 + seed)
    assert model.session.derangement.cache_info().currsize == DERANGEMENTS_KEPT
    for seed in (0, 3 * DERANGEMENTS_KEPT - 1, 10_002):  # evicted, kept, and used by analyse
        assert model.donor_for(1, seed) == int(derangement(len(model.eval_windows), seed)[1])


def test_model_pool_unloads_idle_models_never_one_in_use(tiny_checkpoints):
    now = [0.0]
    pool = ModelPool(idle_seconds=10, clock=lambda: now[0])
    folder = tiny_checkpoints["featuregate"]
    shared = pool.acquire(folder, calibration_windows=4, eval_windows=4)
    assert pool.acquire(folder, calibration_windows=4, eval_windows=4) is shared  # loaded once, shared
    pool.release(shared)
    session = DashboardSession()
    pool.attach(session)
    session.analyse("fg", shared, window_input(shared, 0), "token_shuffle", layer=1)
    assert len(session.replays) == 1
    now[0] = 100.0
    assert pool.unload_idle() == [] and pool.loaded == [folder]  # in use (one acquire not released yet)
    pool.release(shared)
    now[0] = 105.0
    assert pool.unload_idle() == []  # released 5 s ago: not idle long enough
    now[0] = 110.0
    assert pool.unload_idle() == [folder] and pool.loaded == []
    assert len(session.replays) == 0  # the session dropped its caches, which held the model
    model = weakref.ref(shared.model)
    del shared
    gc.collect()
    assert model() is None  # nothing keeps the unloaded model alive
    again = pool.acquire(folder, calibration_windows=4, eval_windows=4)  # loaded anew on the next use
    analysis = session.analyse("fg", again, window_input(again, 0), "token_shuffle", layer=1)
    assert analysis.start_layer == again.model.resume_layer(1) and len(session.replays) == 1
    never = ModelPool(idle_seconds=0, clock=lambda: now[0])
    never.release(never.acquire(folder, calibration_windows=4, eval_windows=4))
    now[0] = 1e9
    assert never.unload_idle() == [] and never.loaded == [folder]


def test_session_limit_admits_up_to_the_maximum():
    limit = SessionLimit(2)
    assert limit.admit() and limit.admit() and not limit.admit() and limit.open == 2
    limit.leave()
    assert limit.admit() and not limit.admit()
    unlimited = SessionLimit(0)
    assert all(unlimited.admit() for _ in range(100))


def test_changes_queued_after_the_write_block_was_lifted_are_sent():
    """The race that left results-view picks unshown under load (``panel_writes``), made deterministic: a session's
    changes are queued for sending, then the task before lifts the session's write block before the task that
    was to send them starts."""
    import asyncio

    import panel.io.document as panel_document
    from bokeh.document import Document
    from panel_writes import fix_stranded_writes, sends_stranded_changes

    class Socket:  # what Panel writes to, through its hook for other kinds of socket
        pass

    class Connection:
        _socket = Socket()

    sent = []
    panel_document.extra_socket_handlers[Socket] = lambda conn, msg: sent.append(msg) or []
    doc, connection = Document(), Connection()
    upstream = getattr(panel_document._dispatch_msgs, "__wrapped__", panel_document._dispatch_msgs)
    try:
        for dispatch in (upstream, sends_stranded_changes(upstream)):
            sent.clear()
            panel_document._WRITE_MSGS[doc] = {connection: ["PATCH-DOC 1", "PATCH-DOC 2"]}
            panel_document._WRITE_BLOCK.pop(doc, None)
            asyncio.run(dispatch(doc))
        assert sent == ["PATCH-DOC 1", "PATCH-DOC 2"]  # both sent, in order, by the fixed task
        assert doc not in panel_document._WRITE_BLOCK and doc not in panel_document._WRITE_MSGS  # nothing left
    finally:
        del panel_document.extra_socket_handlers[Socket]
        panel_document._WRITE_MSGS.pop(doc, None)
        panel_document._WRITE_BLOCK.pop(doc, None)
    assert fix_stranded_writes() and fix_stranded_writes()  # installed once, then left as it is
    assert panel_document._dispatch_msgs.sends_stranded_changes
    assert panel_document._dispatch_msgs.__wrapped__ is upstream


def test_token_html_escapes_everything():
    import views

    html = views.token_html(["<script>", "alert('x')", "</script>", "&amp;"], np.array([0.5, -0.2, 0.1]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;amp;" in html
    assert html.count('class="fca-token"') == 4


# ------------------------------------------------------------------------------------------------ results folder


@pytest.fixture(scope="module")
def results_root(tiny_checkpoints, tmp_path_factory):
    """A results folder as a lab's looks: a fresh tiny per-layer audit of the tiny FeatureGate (``fca audit``'s
    layout), a copy in ``fca reproduce``'s layout, a truncated audit.json, a foreign one, and a link out."""
    import shutil

    from fca_workbench.audit.run import AuditSettings, run_audit

    root = tmp_path_factory.mktemp("results")
    settings = AuditSettings(
        checkpoint=str(tiny_checkpoints["featuregate"]),
        window=64,
        max_windows=16,
        resamples=200,
        latency_repeats=1,
        per_layer=True,
    )
    run_audit(settings, root / "audit-featuregate-tiny")
    shutil.copytree(
        root / "audit-featuregate-tiny",
        root / "run" / "audits" / "featuregate-tiny",
        ignore=shutil.ignore_patterns("cache"),
    )
    text = (root / "audit-featuregate-tiny" / "audit.json").read_text()
    (root / "truncated").mkdir()
    (root / "truncated" / "audit.json").write_text(text[: len(text) // 2])
    (root / "foreign").mkdir()
    (root / "foreign" / "audit.json").write_text(json.dumps({"schema": "someone-else/2", "nll": 1.0}))
    outside = tmp_path_factory.mktemp("outside")
    (outside / "audit.json").write_text(text)
    (root / "linked").mkdir()
    (root / "linked" / "audit.json").symlink_to(outside / "audit.json")
    return root


def test_results_folder_lists_every_layout_and_names_what_it_cannot_show(results_root):
    from fca_workbench.viewmodel.results_folder import ResultsFolder

    results = ResultsFolder(results_root)
    entries = {entry.name: entry for entry in results.scan()}
    assert sorted(entries) == [
        "audit-featuregate-tiny",
        "foreign",
        "linked",
        "run/audits/featuregate-tiny",
        "truncated",
    ]
    shown = [name for name, entry in entries.items() if entry.audit is not None]
    assert shown == ["audit-featuregate-tiny", "run/audits/featuregate-tiny"]
    assert "not a complete audit.json" in entries["truncated"].problem
    assert "not an FCA audit" in entries["foreign"].problem and "someone-else/2" in entries["foreign"].problem
    assert "is a link" in entries["linked"].problem
    assert all(str(results_root) not in entry.problem for entry in entries.values() if entry.problem)  # no server path
    on_disk = (results_root / "audit-featuregate-tiny" / "audit.json").read_bytes()
    assert results.read_bytes(results.entry("audit-featuregate-tiny"), "audit.json") == on_disk
    for name in ("../outside", "/etc", str(results_root / "foreign"), None, ["foreign"]):
        with pytest.raises(UserError, match="no audit called"):
            results.entry(name)
    with pytest.raises(UserError, match="is a link"):
        results.read_bytes(entries["linked"], "audit.json")


def test_audit_tables_are_the_audit_numbers(results_root):
    from fca_workbench.notebooks import tables
    from fca_workbench.viewmodel.results_folder import audit_tables

    audit = json.loads((results_root / "audit-featuregate-tiny" / "audit.json").read_text())
    made = {table.attrs["name"]: table for table in audit_tables(audit)}
    assert list(made) == [
        "assignment_per_model",
        "retention_per_model",
        "variation_per_model",
        "execution",
        "positive_control",
        "per_layer",
    ]
    conditions = made["assignment_per_model"].set_index("condition")
    for name, figures in audit["conditions"].items():  # read back at full precision from the CSV the view offers
        assert conditions.loc[name, "delta_ci95_hi"] == figures["delta_ci95"][1]
    per_layer = made["per_layer"]
    intervening = [c for c in audit["conditions"] if c not in BASELINES]
    assert len(per_layer) == len(audit["per_layer"]) == 2 * len(intervening)  # 2 layers x every intervention
    assert per_layer["delta"].tolist() == [row["delta"] for row in audit["per_layer"]]
    import io

    import pandas as pd

    back = pd.read_csv(io.StringIO(tables.to_csv(made["retention_per_model"])))
    for profile, figures in audit["retention"].items():  # an unresolved retention is an empty cell, never a number
        cell = back.loc[0, profile]
        assert pd.isna(cell) if figures["value"] is None else cell == figures["value"]


def test_live_view_reads_static_profiles_of_a_matching_audit_and_says_so(tiny_checkpoints, results_root, shared_models):
    from fca_workbench.results.profiles import load_profiles
    from fca_workbench.viewmodel.results_folder import ResultsFolder, per_layer_audit

    folder = tiny_checkpoints["featuregate"]
    results = ResultsFolder(results_root)
    matched = SharedModel(folder, calibration_windows=16, eval_windows=4, results=results)
    profiles = matched.profiles()
    assert "audit '" in matched.profiles_source and "fingerprints match" in matched.profiles_source
    saved = load_profiles(results_root / "audit-featuregate-tiny" / "static_profiles.safetensors")
    assert all(torch.equal(a, b) for name in saved for a, b in zip(profiles[name], saved[name]))
    computed = SharedModel(folder, calibration_windows=16, eval_windows=4)  # no results folder: computed here
    for name, layers in computed.profiles().items():  # the audit's profiles are this data's profiles
        for a, b in zip(layers, profiles[name]):
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-6)
    assert computed.profiles_source == "computed here from 16 calibration windows"
    other_data = SharedModel(folder, calibration_windows=8, eval_windows=4, results=results)
    other_data.profiles()
    assert other_data.profiles_source.startswith("computed here from 8 calibration windows (no audit")
    analysis = DashboardSession().analyse("fg", matched, window_input(matched, 0), "layer_mean")
    assert analysis.profiles_source == matched.profiles_source
    assert per_layer_audit(results, matched).name in ("audit-featuregate-tiny", "run/audits/featuregate-tiny")
    assert per_layer_audit(results, shared_models["muddpythia"]) is None  # audits of other models are not its own


def test_by_default_the_calibration_windows_are_those_of_the_checkpoints_audit(tiny_checkpoints, results_root):
    """Without ``--calibration-windows`` the profiles come from the audit's own count of calibration windows
    (its saved profiles then serve), never from every window of the split."""
    from fca_workbench.audit.inputs import CALIBRATION
    from fca_workbench.viewmodel.results_folder import ResultsFolder

    audit = json.loads((results_root / "audit-featuregate-tiny" / "audit.json").read_text())
    model = SharedModel(tiny_checkpoints["featuregate"], eval_windows=4, results=ResultsFolder(results_root))
    model.profiles()
    assert len(model.session.windows(CALIBRATION)) == audit["data"]["calibration"]["windows"]
    assert "audit '" in model.profiles_source and "fingerprints match" in model.profiles_source


def test_computing_profiles_says_its_stage_and_clears_it(tiny_checkpoints):
    model = SharedModel(tiny_checkpoints["featuregate"], calibration_windows=8, eval_windows=2)
    stages = []
    estimating = model.session.on_profile_batch
    model.session.on_profile_batch = lambda done, total: (estimating(done, total), stages.append(model.stage))
    model.profiles()
    assert stages and all(re.fullmatch(r"computing static profiles: \d of 8 calibration windows", s) for s in stages)
    assert stages[-1] == "computing static profiles: 8 of 8 calibration windows"
    assert model.stage is None and model.profiles_source == "computed here from 8 calibration windows"


@pytest.mark.timeout(300)
def test_fca_dashboard_says_serving_on_only_once_the_port_answers(tiny_checkpoints, tmp_path):
    import subprocess

    (tmp_path / "registry.json").write_text(json.dumps({"fg": str(tiny_checkpoints["featuregate"])}))
    port = free_port()
    command = [sys.executable, "-m", "fca_workbench", "dashboard", "--port", str(port)]
    command += ["--registry", str(tmp_path / "registry.json"), "--results", str(tmp_path)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        lines = []
        while not lines or "serving on" not in lines[-1]:
            line = server.stdout.readline()
            assert line, "fca dashboard ended before it said it serves:\n" + "".join(lines)
            lines.append(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/js/bokeh.min.js", timeout=30) as response:
            assert response.status == 200  # at once: no retry, no wait
        assert lines[-1].strip() == f"fca dashboard: serving on http://127.0.0.1:{port}/ (Ctrl-C stops it)"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_link_values_are_checked_before_they_reach_a_widget():
    from fca_workbench.viewmodel.query import choose, choose_index

    requested = {"checkpoint": "fg", "layer": 1, "window": "abc", "seed": True, "condition": ["x"], "donor": -1}
    assert choose(requested, "checkpoint", ["fg", "mudd"], "mudd", "is not a checkpoint") == ("fg", None)
    assert choose({"checkpoint": "../etc"}, "checkpoint", ["fg"], "fg", "is not a checkpoint") == (
        "fg",
        "the link's checkpoint='../etc' is not a checkpoint; showing 'fg' instead",
    )
    assert choose(requested, "condition", ["x"], "correct", "is not an intervention")[0] == "correct"  # unhashable
    assert choose(requested, "view", ["live"], "live", "-") == ("live", None)  # absent: the default, no message
    assert choose_index(requested, "layer", 0, 1, -1) == (1, None)
    assert choose_index(requested, "layer", 0, 0, -1, "all layers") == (
        -1,
        "the link's layer=1 is not an integer in 0; showing all layers instead",
    )
    assert choose_index(requested, "window", 0, 5, 0)[1].startswith("the link's window='abc' is not an integer in 0–5")
    assert choose_index(requested, "seed", 0, 10, 0)[0] == 0  # True is not a seed
    assert choose_index(requested, "donor", -1, 5, -1) == (-1, None)


# ------------------------------------------------------------------------------------------------ serving


def _dashboard_args(monkeypatch, *argv):
    from fca_workbench.cli import build_parser
    from fca_workbench.viewmodel.serving import serving_auth

    for variable in ("FCA_BASIC_AUTH", "FCA_COOKIE_SECRET"):
        monkeypatch.delenv(variable, raising=False)
    return serving_auth(build_parser().parse_args(["dashboard", *argv]))


def test_fca_dashboard_refuses_unsafe_serving_in_one_line(tmp_path, monkeypatch, capsys):
    from fca_workbench.cli import main

    for variable in ("FCA_BASIC_AUTH", "FCA_COOKIE_SECRET"):
        monkeypatch.delenv(variable, raising=False)
    missing = ["--registry", str(tmp_path / "missing.json")]  # were the checks absent, this error would show
    (tmp_path / "password").write_text("hunter2\n")
    password = ["--basic-auth-password-file", str(tmp_path / "password")]
    for argv, message in [
        (["--address", "0.0.0.0"], "--address 0.0.0.0 lets the network reach the dashboard"),
        (["--address", "lab.example"], "--address lab.example lets the network reach the dashboard"),
        (["--basic-auth", "hunter2"], "--basic-auth on the command line is visible to every user in `ps`"),
        (password, "basic auth needs a --cookie-secret-file"),
        (["--address", "0.0.0.0", *password], "basic auth needs a --cookie-secret-file"),
        ([*password, "--cookie-secret", "s", "--no-auth"], "--no-auth contradicts --basic-auth-file"),
        (["--cookie-secret-file", str(tmp_path / "nope")], "--cookie-secret-file"),
    ]:
        assert main(["dashboard", *argv, *missing]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"fca: error: {message}"), err
    monkeypatch.setenv("FCA_BASIC_AUTH", "hunter2")  # a password from the environment needs the secret too
    assert main(["dashboard", *missing]) == 2
    assert "basic auth needs a --cookie-secret-file" in capsys.readouterr().err


def test_dashboard_auth_comes_from_files_or_the_environment(tmp_path, monkeypatch, capsys):
    assert _dashboard_args(monkeypatch) == {}  # loopback: no authentication needed
    assert _dashboard_args(monkeypatch, "--address", "::1") == {}
    assert _dashboard_args(monkeypatch, "--address", "0.0.0.0", "--no-auth") == {}
    (tmp_path / "password").write_text("hunter2\n")
    (tmp_path / "secret").write_text("s" * 64)
    (tmp_path / "users.json").write_text(json.dumps({"alice": "pw"}))
    files = ["--cookie-secret-file", str(tmp_path / "secret")]
    assert _dashboard_args(
        monkeypatch, "--address", "0.0.0.0", "--basic-auth-password-file", str(tmp_path / "password"), *files
    ) == {"basic_auth": "hunter2", "cookie_secret": "s" * 64}
    users = ["--basic-auth-file", str(tmp_path / "users.json")]  # JSON credentials: Panel reads the file itself
    assert _dashboard_args(monkeypatch, "--address", "0.0.0.0", *users, *files) == {
        "basic_auth": str(tmp_path / "users.json"),
        "cookie_secret": "s" * 64,
    }
    assert "visible" not in capsys.readouterr().err  # nothing secret was on the command line
    monkeypatch.setenv("FCA_BASIC_AUTH", "from-env")
    monkeypatch.setenv("FCA_COOKIE_SECRET", "secret-from-env")
    from fca_workbench.cli import build_parser
    from fca_workbench.viewmodel.serving import serving_auth

    assert serving_auth(build_parser().parse_args(["dashboard", "--address", "0.0.0.0"])) == {
        "basic_auth": "from-env",
        "cookie_secret": "secret-from-env",
    }
    assert serving_auth(build_parser().parse_args(["dashboard", "--cookie-secret", "x"])) == {
        "basic_auth": "from-env",
        "cookie_secret": "x",
    }
    assert "visible to every user in `ps`" in capsys.readouterr().err  # typed secrets are warned about


@contextmanager
def dashboard_server(root: Path, registry: dict, *argv, env=None, calibration_windows: int | None = 16):
    """``fca dashboard`` on a free localhost port in a subprocess; yields (url, server log) once it answers.
    ``calibration_windows`` None: the server's default (those of each checkpoint's audit)."""
    (root / "registry.json").write_text(json.dumps(registry))
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "fca_workbench",
        "dashboard",
        "--port",
        str(port),
        "--registry",
        str(root / "registry.json"),
        *(["--calibration-windows", str(calibration_windows)] if calibration_windows else []),
        *argv,
    ]
    url = f"http://127.0.0.1:{port}/"
    # probed with a static file: a page would open a session (counted against --max-sessions until reaped)
    with serving(
        command,
        url + "static/js/bokeh.min.js",
        root / "server.log",
        "dashboard server",
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    ):
        yield url, root / "server.log"


def assert_quiet(server_log: Path):
    """The server wrote no traceback and no warning (Panel warns, for one, at every session that schedules a
    process-wide task under a name already taken by another callable)."""
    log = server_log.read_text()
    assert "Traceback" not in log and "WARNING" not in log, log[-3000:]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # hand the 3xx back as an HTTPError, to look at


def _status(opener, url, data=None) -> tuple[int, str, str]:
    """(status, Location header, body) of one request, redirects not followed."""
    try:
        with opener.open(url, data=data, timeout=30) as response:
            return response.status, "", response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", ""), ""


def test_environment_auth_guards_the_dashboard(tiny_checkpoints, tmp_path):
    env = {"FCA_BASIC_AUTH": "lab-password", "FCA_COOKIE_SECRET": "c" * 64}  # never on the command line
    with dashboard_server(tmp_path, {"fg": str(tiny_checkpoints["featuregate"])}, env=env) as (url, server_log):
        anonymous = urllib.request.build_opener(_NoRedirect)
        status, location, _ = _status(anonymous, url)
        assert status == 302 and "login" in location  # no page, no session without logging in
        status, _, body = _status(anonymous, url + "login")
        assert status == 200 and 'name="password"' in body
        _, status, location, cookies = _logged_in(url, "wrong")
        assert status == 302 and "error" in location and "user" not in cookies
        opener, status, location, cookies = _logged_in(url, "lab-password")
        assert status == 302 and "user" in cookies
        status, _, body = _status(opener, url)
        assert status == 200 and "<title>FCA dashboard</title>" in body
        status, _, _ = _status(opener, url + "static/..%2f..%2f..%2fetc%2fpasswd")
        assert status in (403, 404)  # static routes still refuse traversal
        log = server_log.read_text()
    assert "lab-password" not in log and "Traceback" not in log


def _logged_in(url: str, password: str):
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPCookieProcessor(jar))
    form = urllib.parse.urlencode({"username": "alice", "password": password}).encode()
    status, location, _ = _status(opener, url + "login", form)
    return opener, status, location, {cookie.name for cookie in jar}


# ------------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory, results_root):
    """``fca dashboard`` on a free localhost port, with the tiny checkpoints, one broken entry and the results
    folder of ``results_root``."""
    require_browser()
    root = tmp_path_factory.mktemp("dashboard")
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text('{"model_type": "fca-featuregate", "n_embd": 7, "n_head": 2}')
    registry = {
        "featuregate-tiny": str(tiny_checkpoints["featuregate"]),
        "muddpythia-tiny": str(tiny_checkpoints["muddpythia"]),
        "dense-tiny": str(tiny_checkpoints["dense"]),
        "broken": str(root / "broken"),
    }
    with dashboard_server(root, registry, "--results", str(results_root)) as served:
        yield served


# The token pane's HTML as the server produced it: Panel ships an HTML pane's markup escaped once more and
# unescapes it in the browser, so decode it once (a textarea parses its content as text with entities).
SENT_TOKEN_HTML = """() => {
    const pane = [...Bokeh.documents[0].all_models].find(m => (m.css_classes || []).includes('fca-token-pane'));
    const decode = document.createElement('textarea');
    decode.innerHTML = pane.text;
    return decode.value;
}"""


def _update_number(page) -> int:
    return int(page.locator(".fca-update").get_attribute("data-update"))


def _wait_for_update(page, after: int) -> str:
    """Wait until the app finished the update after number ``after``; returns its state (ok/error). Waited for on
    the state, for as long as a loaded machine needs: the calling test's own timeout turns a hang into a failure."""
    while _update_number(page) <= after:
        page.wait_for_timeout(150)
    return page.locator(".fca-update").get_attribute("data-state")


def _plot(page, pane: str) -> str:
    """The plotted values of a pane's figure, as JSON."""
    return page.locator(f".{pane} .js-plotly-plot").evaluate("el => JSON.stringify(el.data.map(d => d.z || d.y))")


@pytest.mark.timeout(900)  # a hang fails here instead of eating CI's time; the test takes ~1-2 min
def test_dashboard_in_a_real_browser(served):
    from playwright.sync_api import sync_playwright

    url, server_log = served
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    update_number, wait_for_update, plot = _update_number, _wait_for_update, _plot

    def snap(page, name):
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1500})
            page.goto(url, timeout=120_000)
            page.wait_for_selector(".fca-update[data-state]", timeout=120_000)
            assert page.locator(".fca-update").get_attribute("data-state") == "ok", page.locator(
                ".fca-update"
            ).inner_text()
            n = update_number(page)
            delta0, heat0 = plot(page, "fca-delta"), plot(page, "fca-layer-heat")
            snap(page, "01-token-shuffle-all-layers")

            page.locator(".fca-layer select").select_option(label="layer 1")
            assert wait_for_update(page, n) == "ok"
            n = update_number(page)
            delta1, heat1 = plot(page, "fca-delta"), plot(page, "fca-layer-heat")
            assert delta1 != delta0 and heat1 != heat0
            assert "layer 1 (prefix cache)" in page.locator(".fca-summary").inner_text()

            page.locator(".fca-condition select").select_option("layer_mean")
            assert wait_for_update(page, n) == "ok"
            n = update_number(page)
            delta2, heat2 = plot(page, "fca-delta"), plot(page, "fca-layer-heat")
            assert delta2 != delta1 and heat2 != heat1
            assert "gap retention" in page.locator(".fca-summary").inner_text()
            snap(page, "02-layer-mean-layer-1")

            attack = "<script>window.__fca_pwned = 1</script> Good night, <b>sweet</b> prince & co"
            page.locator(".fca-text textarea").fill(attack)
            page.locator(".fca-analyse button").click()
            assert wait_for_update(page, n) == "ok"
            n = update_number(page)
            shown = page.locator(".fca-token-pane .fca-tokens").inner_text()
            assert shown.strip() == attack  # the markup is shown as text ...
            assert page.evaluate("window.__fca_pwned") is None  # ... never run
            assert page.locator(".fca-token-pane script").count() == 0
            assert page.locator(".fca-token-pane b").count() == 0
            # The DOM alone cannot tell: this tokenizer splits "<", "/" and ">" into tokens of their own, and a
            # lone "<" in a span parses as text. So read the markup the server sent for the token pane.
            sent = page.evaluate(SENT_TOKEN_HTML)
            tokens = re.findall(r'<span class="fca-token"[^>]*>([^<]*)</span>', sent)
            assert "".join(tokens).strip() == html.escape(attack) and "<script" not in sent
            snap(page, "03-pasted-script-escaped")

            page.locator(".fca-text textarea").fill("")
            page.locator(".fca-analyse button").click()
            assert wait_for_update(page, n) == "error"
            n = update_number(page)
            assert "pasted text is empty" in page.locator(".fca-error").inner_text()
            assert page.get_by_text("pasted text is empty").first.is_visible()

            page.locator(".fca-text textarea").fill("x" * (MAX_PASTE_CHARS + 10))
            page.locator(".fca-analyse button").click()
            assert wait_for_update(page, n) == "error"
            n = update_number(page)
            assert "the limit is" in page.locator(".fca-error").inner_text()

            page.locator(".fca-checkpoint select").select_option("broken")
            assert wait_for_update(page, n) == "error"
            n = update_number(page)
            assert (
                "broken" in page.locator(".fca-error").inner_text()
                or "checkpoint" in page.locator(".fca-error").inner_text()
            )
            snap(page, "04-broken-checkpoint-message")

            page.locator(".fca-checkpoint select").select_option("muddpythia-tiny")  # the session keeps working
            wait_for_update(page, n)
            n = update_number(page)
            page.locator(".fca-source button").first.click()  # back to an eval window
            assert wait_for_update(page, n) == "ok", page.locator(".fca-update").inner_text()
            n = update_number(page)
            page.locator(".fca-condition select").select_option("cross_input")
            assert wait_for_update(page, n) == "ok"
            assert "donor window" in page.locator(".fca-summary").inner_text()
            snap(page, "05-muddpythia-cross-input")
        finally:
            browser.close()
    assert_quiet(server_log)


@pytest.fixture(scope="module")
def browser(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _opened(browser, url: str):
    """A page at ``url`` once the live view finished its first update (ok or error)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1500}, accept_downloads=True)
    page.goto(url, timeout=120_000)
    page.wait_for_selector(".fca-update[data-state]", timeout=120_000)
    return page


def _selected(page, widget: str) -> str:
    return page.locator(f".{widget} select").evaluate("el => el.options[el.selectedIndex].text")


def _state(page) -> str:
    return page.locator(".fca-update").get_attribute("data-state")


def _shows_figure(page, pane: str) -> bool:
    """Whether the pane is visible and holds a plotted figure."""
    plot = page.locator(f".{pane} .js-plotly-plot")
    return (
        page.locator(f".{pane}").first.is_visible()
        and plot.count() == 1
        and plot.evaluate("el => (el.data || []).length") > 0
    )


def _query(page) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.url).query))


@pytest.mark.timeout(600)
def test_a_link_reproduces_the_view_and_a_bad_link_gives_a_message(served, browser):
    url, server_log = served
    link = "?checkpoint=muddpythia-tiny&window=3&layer=1&intervention=cross_input&seed=5&donor=2&heat_layer=1"
    page = _opened(browser, url + link)
    assert _state(page) == "ok", page.locator(".fca-update").inner_text()
    assert _selected(page, "fca-checkpoint") == "muddpythia-tiny" and _selected(page, "fca-layer") == "layer 1"
    assert _selected(page, "fca-condition") == "cross_input" and _selected(page, "fca-heat-layer") == "layer 1"
    assert (
        page.locator(".fca-window input").input_value() == "3" and page.locator(".fca-seed input").input_value() == "5"
    )
    summary = page.locator(".fca-summary").inner_text()
    assert (
        re.search(r"intervened at\s+layer 1", summary)
        and "(prefix cache)" in summary
        and re.search(r"donor window\s+2", summary)
        and re.search(r"seed\s+5", summary)
    )
    assert not page.locator(".fca-link-message").is_visible() and not page.locator(".fca-link-note").count()
    assert not _shows_figure(page, "fca-live-per-layer")  # no audit of this checkpoint
    query = _query(page)  # the app wrote its whole selection into the URL
    assert {k: query.get(k) for k in ("checkpoint", "window", "layer", "intervention", "seed", "donor")} == {
        "checkpoint": "muddpythia-tiny",
        "window": "3",
        "layer": "1",
        "intervention": "cross_input",
        "seed": "5",
        "donor": "2",
    }

    page.locator(".fca-condition select").select_option("token_shuffle")
    assert _wait_for_update(page, _update_number(page)) == "ok"
    page.wait_for_function("() => location.search.includes('intervention=token_shuffle')", timeout=30_000)
    shared = page.url
    delta, heat = _plot(page, "fca-delta"), _plot(page, "fca-slot-heat")
    again = _opened(browser, shared)  # the shared link, opened elsewhere: the same view, the same numbers
    assert _state(again) == "ok" and _selected(again, "fca-condition") == "token_shuffle"
    assert _plot(again, "fca-delta") == delta and _plot(again, "fca-slot-heat") == heat
    page.screenshot(path=str(SCREENSHOTS / "06-shared-link.png"), full_page=True)

    bad = _opened(
        browser, url + "?checkpoint=nope&layer=99&intervention=bogus&window=abc&seed=-4&view=elsewhere&slot=%3Cb%3E"
    )
    assert _state(bad) == "ok", bad.locator(".fca-update").inner_text()
    message = " ".join(bad.locator(".fca-link-note").all_inner_texts())
    for part in (
        "checkpoint='nope'",
        "layer=99",
        "intervention='bogus'",
        "window='abc'",
        "seed=-4",
        "view='elsewhere'",
        "slot='<b>'",
    ):
        assert part in message, (part, message)
    assert _selected(bad, "fca-checkpoint") == "featuregate-tiny" and _selected(bad, "fca-layer") == "all layers"
    assert _selected(bad, "fca-condition") == "token_shuffle"
    assert _shows_figure(bad, "fca-live-per-layer")  # this checkpoint has an audit with a per-layer sweep
    assert _query(bad)["checkpoint"] == "featuregate-tiny"  # the URL now names the view shown
    bad.locator(".fca-condition select").select_option("layer_mean")
    assert _wait_for_update(bad, _update_number(bad)) == "ok"
    assert (
        "audit 'audit-featuregate-tiny'" in bad.locator(".fca-summary").inner_text()
        or "audit 'run/audits/featuregate-tiny'" in bad.locator(".fca-summary").inner_text()
    )
    bad.screenshot(path=str(SCREENSHOTS / "07-bad-link-message.png"), full_page=True)
    assert_quiet(server_log)


@pytest.mark.timeout(600)
def test_results_view_lists_audits_and_downloads_their_files(served, browser, results_root):
    from fca_workbench.notebooks import tables
    from fca_workbench.viewmodel.downloads import download_csv

    url, server_log = served
    page = _opened(browser, url + "?view=results&audit=run/audits/featuregate-tiny")
    page.wait_for_selector(".fca-results-title", timeout=60_000)
    assert page.locator(".fca-results-title").inner_text() == "run/audits/featuregate-tiny"
    none, *options = page.locator(".fca-audit select option").all_inner_texts()
    assert "overview only" in none and len(options) == 2 and all("featuregate" in o for o in options)
    problems = {p.get_attribute("data-entry"): p.inner_text() for p in page.locator(".fca-results-problem").all()}
    assert sorted(problems) == ["foreign", "linked", "truncated"]
    assert "not a complete audit.json" in problems["truncated"] and "is a link" in problems["linked"]
    assert _shows_figure(page, "fca-results-per-layer")
    audit_file = results_root / "run" / "audits" / "featuregate-tiny" / "audit.json"
    audit = json.loads(audit_file.read_text())
    expected = {
        "audit": audit_file.read_bytes(),
        "assignment_per_model": download_csv(tables.assignment_table([audit])).encode(),
        "per_layer": download_csv(tables.per_layer_table([audit])).encode(),
    }
    for name, content in expected.items():
        with page.expect_download(timeout=60_000) as download:
            page.locator(f".fca-download-{name} button, .fca-download-{name} a").first.click()
        assert Path(download.value.path()).read_bytes() == content, name
    shown = page.locator(".fca-table-assignment_per_model").inner_text()
    assert f"{audit['conditions']['cross_input']['delta']:+.4f}" in shown
    page.screenshot(path=str(SCREENSHOTS / "08-results-view.png"), full_page=True)
    page.locator(".fca-audit select").select_option(
        label=next(o for o in options if o.startswith("audit-featuregate-tiny"))
    )
    page.wait_for_function("() => location.search.includes('audit=audit-featuregate-tiny')", timeout=30_000)
    assert page.locator(".fca-results-title").inner_text() == "audit-featuregate-tiny"
    assert_quiet(server_log)
