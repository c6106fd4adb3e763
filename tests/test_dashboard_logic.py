"""The dashboard's logic without a browser: the served settings, the server's default checkpoint and scrubbed
load errors, a link fitted to a checkpoint, a session's update protocol; and the split itself (the view model
imports no Panel, each concept is defined once, the app needs no ``noqa``)."""

import argparse
import ast
import asyncio
import json
import logging
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from fca_workbench.adapters.sites import chosen_controllers, controller_labels, site_choices
from fca_workbench.cli import main
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.resources import checkpoints_dir
from fca_workbench.viewmodel import MODELS, SESSIONS, Registry, SharedModel
from fca_workbench.viewmodel.links import (
    TEXT_SOURCE,
    WINDOW_SOURCE,
    Selection,
    fitted,
    heat_controller,
    link_of,
    linked,
    opening_checkpoint,
    opening_view,
)
from fca_workbench.viewmodel.query import ALL_LAYERS, AUDIT_DONOR, AUDIT_DONOR_LINK, SOURCES
from fca_workbench.viewmodel.server import Server, configure
from fca_workbench.viewmodel.serving import ENVIRONMENT, ServedSettings, served_settings
from fca_workbench.viewmodel.session_updates import Document, LiveReplay, Updates

ROOT = Path(__file__).resolve().parent.parent
VIEW_MODEL = ROOT / "fca_workbench" / "viewmodel"
APP = ROOT / "dashboards"
sys.path.insert(0, str(APP))
BROKEN_CONFIG = '{"model_type": "fca-featuregate", "n_embd": 7, "n_head": 2}'


# ------------------------------------------------------------------------------------------------ settings


def test_served_settings_come_from_args_else_the_environment_else_the_defaults():
    assert served_settings([], {}) == ServedSettings()
    environ = {ENVIRONMENT["registry"]: "lab.json", ENVIRONMENT["max_sessions"]: "3", ENVIRONMENT["results"]: "r"}
    assert served_settings(["--max-sessions", "5", "--port", "1"], environ) == ServedSettings(
        registry="lab.json", max_sessions=5, results="r"
    )  # --port is Panel's, left to it
    assert served_settings(["--calibration-windows", "0", "--model-idle-seconds", "0"], {}) == ServedSettings(
        calibration_windows=None, model_idle_seconds=0.0
    )
    assert served_settings([], {ENVIRONMENT["calibration_windows"]: "16"}).calibration_windows == 16
    with pytest.raises(UserError, match=r"--max-sessions must be >= 0 \(0: no limit\), got -2"):
        served_settings(["--max-sessions", "-2"], {})


def test_fca_dashboard_and_panel_serve_share_the_settings(capsys):
    from fca_workbench.cli import build_parser

    args = build_parser().parse_args(["dashboard", "--max-sessions", "2", "--calibration-windows", "8"])
    assert ServedSettings.from_args(args) == served_settings(["--max-sessions", "2", "--calibration-windows", "8"], {})
    assert ServedSettings.from_args(build_parser().parse_args(["dashboard"])) == ServedSettings()
    assert main(["dashboard", "--model-idle-seconds", "-1"]) == 2  # checked before any server starts
    assert capsys.readouterr().err.strip() == "fca: error: --model-idle-seconds must be >= 0 (0: no limit), got -1.0"


def test_configure_applies_the_settings_once_per_process(tiny_checkpoints, tmp_path):
    (tmp_path / "registry.json").write_text(json.dumps({"fg": str(tiny_checkpoints["featuregate"])}))
    before = SESSIONS.maximum, MODELS.idle_seconds
    try:
        settings = ServedSettings(registry=str(tmp_path / "registry.json"), max_sessions=3, results=None)
        server = configure(settings)
        assert (SESSIONS.maximum, MODELS.idle_seconds) == (3, settings.model_idle_seconds)
        assert server.registry.names == ["fg"] and server.results is None
        assert configure(settings) is server  # ``panel serve`` configures at every session: one Server still
        assert configure(ServedSettings(registry=settings.registry, results=str(tmp_path))) is not server
    finally:
        SESSIONS.maximum, MODELS.idle_seconds = before


# ------------------------------------------------------------------------------------------------ server


def test_a_load_error_names_the_checkpoint_never_the_folder(tmp_path):
    (tmp_path / "secret-folder").mkdir()
    (tmp_path / "secret-folder" / "config.json").write_text(BROKEN_CONFIG)
    server = Server(Registry({"broken": tmp_path / "secret-folder"}))
    with pytest.raises(UserError) as error:
        server.acquire("broken")
    assert str(error.value).startswith("checkpoint 'broken' cannot be used: ")
    assert str(tmp_path) not in str(error.value) and "secret-folder" not in str(error.value)
    with pytest.raises(UserError, match="unknown checkpoint '../etc'"):
        server.acquire("../etc")


def test_the_default_checkpoint_is_the_first_with_a_controller(tiny_checkpoints, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(BROKEN_CONFIG)
    entries = {
        "broken": tmp_path / "broken",
        "plain": tiny_checkpoints["dense"],
        "gated": tiny_checkpoints["featuregate"],
        "mixed": tiny_checkpoints["muddpythia"],
    }
    assert Server(Registry(entries)).default_checkpoint() == "gated"
    assert Server(Registry({k: entries[k] for k in ("plain", "broken")})).default_checkpoint() == "plain"  # none: first


def test_the_shipped_registry_opens_on_the_same_checkpoint_as_before():
    shipped = Registry.shipped()
    if "featuregate-s0" not in shipped.names:
        pytest.skip(f"no shipped checkpoints in {checkpoints_dir()}")
    assert shipped.names[0] != "featuregate-s0"  # the first has no controller: the choice is not just "the first"
    assert Server(shipped).default_checkpoint() == "featuregate-s0"


# ------------------------------------------------------------------------------------------------ links


def fake_model(
    windows=6, layers=4, conditions=("correct", "token_shuffle", "cross_input", "layer_mean"), slots=3, per_layer=1
):
    """A checkpoint as the links see it: ``layers`` decoder layers of ``per_layer`` controllers each (none where it
    has no slots)."""
    labels = [f"slot {i}" for i in range(slots)]
    names = [f"model.layers.{l}.mlp.gate{j}" for l in range(layers) for j in range(per_layer)] if slots else []
    in_layer = [l for l in range(layers) for _ in range(per_layer)] if slots else []
    model = SimpleNamespace(
        eval_windows=[None] * windows,
        conditions=conditions,
        window=64,
        has_coefficients=bool(slots),
        all_slot_labels=lambda: labels,
        site_choices=site_choices(names, in_layer),
        controller_labels=controller_labels(names, in_layer),
    )
    model.controllers_at = lambda at: chosen_controllers(at, names, in_layer)
    return model


def test_the_choices_fit_each_checkpoint():
    model = fake_model()
    fit = fitted(model, layer=7, heat_layer=9, slot="gone", condition="layer_mean_topk", source=TEXT_SOURCE)
    assert list(fit.layers) == ["all layers", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert (fit.layer, fit.heat_layer, fit.slot, fit.condition) == (ALL_LAYERS, 3, "slot 0", "token_shuffle")
    assert fit.window_disabled and not fit.seed_disabled and fit.donor_disabled
    assert fit.window_label == "Eval window (0–5, 64 tokens each)"
    kept = fitted(model, layer=2, heat_layer=1, slot="slot 2", condition="cross_input", source=WINDOW_SOURCE)
    assert (kept.layer, kept.heat_layer, kept.slot, kept.condition) == (2, 1, "slot 2", "cross_input")
    assert not kept.window_disabled and not kept.donor_disabled
    plain = fitted(
        fake_model(slots=0), layer=ALL_LAYERS, heat_layer=0, slot=None, condition="correct", source=WINDOW_SOURCE
    )
    assert plain.slots == [] and plain.slot is None and plain.seed_disabled


def test_a_layer_of_several_controllers_offers_them_together_or_one_alone():
    model = fake_model(layers=2, per_layer=2)
    fit = fitted(model, layer=None, heat_layer=0, slot=None, condition="correct", source=WINDOW_SOURCE)
    assert fit.layers == {
        "all layers": ALL_LAYERS,
        "layer 0": 0,
        "layer 1": 1,
        **{f"model.layers.{l}.mlp.gate{j} alone": f"model.layers.{l}.mlp.gate{j}" for l in range(2) for j in range(2)},
    }
    assert list(fit.heat_layers) == [f"model.layers.{l}.mlp.gate{j}" for l in range(2) for j in range(2)]
    values, notes = linked({"layer": "model.layers.1.mlp.gate0"}, model, [], "correct")
    assert values["layer"] == "model.layers.1.mlp.gate0" and notes == []
    assert linked({"layer": 1}, model, [], "correct")[0]["layer"] == 1
    assert linked({"layer": 3}, model, [], "correct")[0]["layer"] == ALL_LAYERS  # controller 3 is not a layer
    link = link_of("live", Selection(checkpoint="a", layer="model.layers.1.mlp.gate1"), None, 3, None)
    assert link["layer"] == "model.layers.1.mlp.gate1"
    assert heat_controller(model, 1) == 2 and heat_controller(model, "model.layers.1.mlp.gate1") == 3


def test_a_link_is_checked_against_the_checkpoint():
    model = fake_model()
    values, notes = linked(
        {
            "window": 3,
            "layer": 1,
            "condition": "cross_input",
            "seed": 5,
            "donor": 2,
            "heat_layer": 1,
            "heat_slot": "slot 1",
        },
        model,
        model.all_slot_labels(),
        "token_shuffle",
    )
    assert values == {
        "window": 3,
        "layer": 1,
        "condition": "cross_input",
        "seed": 5,
        "donor": 2,
        "heat_layer": 1,
        "heat_slot": "slot 1",
    }
    assert notes == []
    bad = {
        "source": "text",
        "window": 6,
        "layer": 99,
        "condition": "bogus",
        "seed": -4,
        "donor": -2,
        "heat_slot": "<b>",
    }
    values, notes = linked(bad, model, model.all_slot_labels(), "layer_mean")
    assert values == {
        "window": 0,
        "layer": ALL_LAYERS,
        "condition": "layer_mean",
        "seed": 0,
        "donor": AUDIT_DONOR,
        "heat_layer": 0,
        "heat_slot": "slot 0",
    }
    assert notes[0] == "the link was to pasted text, which a link does not carry; showing an eval window instead"
    assert (
        "the link's layer=99 is neither a decoder layer with a controller nor a controller's module path; showing "
        "all layers instead" in notes
    )
    assert (
        "the link's intervention='bogus' is not an intervention of this checkpoint; showing 'layer_mean' instead"
        in notes
    )
    assert "the link's slot='<b>' is not a slot of this checkpoint; showing 'slot 0' instead" in notes
    assert "the link's donor=-2 is not an integer in -1–5; showing the audit's donor instead" in notes
    assert len(notes) == 7
    assert linked({"layer": "all", "source": "sideways"}, model, [], "correct")[1] == [
        "the link's source='sideways' is not a text source (window, text); showing 'window' instead"
    ]
    assert opening_view({"view": "elsewhere"}) == (
        "live",
        "the link's view='elsewhere' is not a view (live, results); showing 'live' instead",
    )
    assert opening_checkpoint({}, ["a", "b"], "b") == ("b", None)


def test_the_link_of_a_view_opens_the_same_view():
    model = fake_model()
    shown = Selection(checkpoint="b", window=4, condition="cross_input", layer=2, seed=7, donor=3)
    link = link_of("live", shown, "slot 2", 1, None)
    assert link["layer"] == 2 and link["source"] == SOURCES[WINDOW_SOURCE] and link["condition"] == "cross_input"
    requested = {k: v for k, v in link.items() if v is not None}
    assert opening_view(requested) == ("live", None) and opening_checkpoint(requested, ["a", "b"], "a") == ("b", None)
    values, notes = linked(requested, model, model.all_slot_labels(), "token_shuffle")
    assert notes == [] and values == {
        "window": 4,
        "layer": 2,
        "condition": "cross_input",
        "seed": 7,
        "donor": 3,
        "heat_layer": 1,
        "heat_slot": "slot 2",
    }
    every = link_of("results", Selection(checkpoint="a"), None, 0, "audit-x")
    assert every["layer"] == "all" and every["donor"] == AUDIT_DONOR_LINK and every["audit"] == "audit-x"
    assert linked({k: v for k, v in every.items() if v is not None}, model, [], "correct")[0]["layer"] == ALL_LAYERS


def test_a_whole_number_a_widget_hands_back_is_an_integer_in_the_link_and_a_link_may_carry_one():
    """A reload once put ``donor=-1.0`` into the URL (Panel reads ``-1`` back as a float): the audit's donor is
    a word in the link, a widget's whole float an integer, and a link carrying ``-1.0`` opens the view it means."""
    link = link_of("live", Selection(checkpoint="a", window=2.0, seed=3.0, donor=4.0), None, 1.0, None)
    assert [(link[k], type(link[k])) for k in ("window", "seed", "donor", "heat_layer")] == [
        (2, int),
        (3, int),
        (4, int),
        (1, int),
    ]
    assert link_of("live", Selection(checkpoint="a"), None, 0, None)["donor"] == AUDIT_DONOR_LINK
    assert linked({"donor": AUDIT_DONOR_LINK}, fake_model(), [], "correct") == (linked({}, fake_model(), [], "correct"))
    values, notes = linked({"donor": -1.0, "window": 2.0}, fake_model(), [], "correct")
    assert notes == [] and (values["donor"], values["window"]) == (AUDIT_DONOR, 2)
    assert linked({"window": 2.5}, fake_model(), [], "correct")[1]  # a fraction is still refused, with a note


def test_an_update_still_working_shows_its_stage_below_the_status_line():
    import time

    import page
    import panel as pn

    shown = SimpleNamespace(
        working_since=time.perf_counter() - page.PROGRESS_AFTER_SECONDS - 1,
        computing_on=SimpleNamespace(stage="computing static profiles: 3 of 10 calibration windows"),
        checkpoint=SimpleNamespace(value="moe"),
        progress=pn.pane.HTML("", visible=False),
        stop_progress=lambda: None,
    )
    page.DashboardApp.show_progress(shown)
    assert shown.progress.visible and "computing static profiles: 3 of 10 calibration windows…" in shown.progress.object
    shown.computing_on = None  # still loading the checkpoint
    page.DashboardApp.show_progress(shown)
    assert "loading checkpoint moe" in shown.progress.object
    fresh = SimpleNamespace(**{**vars(shown), "working_since": time.perf_counter() + 60, "progress": pn.pane.HTML("")})
    page.DashboardApp.show_progress(fresh)  # not yet past the threshold: nothing shown
    assert fresh.progress.object == ""


def test_a_selection_says_what_to_replay():
    assert Selection(checkpoint="a").replay_layer is None and Selection(checkpoint="a", layer=2).replay_layer == 2
    assert Selection(checkpoint="a").chosen_donor is None and Selection(checkpoint="a", donor=4).chosen_donor == 4
    with pytest.raises(UserError, match="seed is empty: enter a non-negative integer"):
        Selection(checkpoint="a", seed=None).checked_seed()


def test_live_replay_computes_a_selection_on_a_window_or_pasted_text(tiny_checkpoints):
    model = SharedModel(tiny_checkpoints["featuregate"], calibration_windows=4, eval_windows=4)
    replay = LiveReplay()
    window = replay.compute(Selection(checkpoint="fg", window=2, condition="cross_input", donor=1), model)
    assert window.donor == 1 and window.condition == "cross_input" and len(window.tokens) == model.window
    pasted = replay.compute(
        Selection(checkpoint="fg", source=TEXT_SOURCE, text="To be, or not", condition="correct"), model
    )
    assert 2 <= len(pasted.tokens) < model.window and float(abs(pasted.delta).max()) == 0.0
    with pytest.raises(UserError, match="pasted text is empty"):
        replay.compute(Selection(checkpoint="fg", source=TEXT_SOURCE, text="  "), model)
    assert replay.audit is None  # no results folder
    replay.close()
    assert not replay.session.results


# ------------------------------------------------------------------------------------------------ updates


class FakeDocument:
    """A served document: next-tick callbacks run on the event loop (or never, with ``runs=False``)."""

    def __init__(self, runs=True):
        self.session_context, self.runs, self.callbacks = object(), runs, 0

    def add_next_tick_callback(self, fn):
        self.callbacks += 1
        if self.runs:
            asyncio.get_running_loop().call_soon(fn)


class FakeView:
    """The app's side of an update, recording what it was asked to do."""

    def __init__(self, name="fg", compute=None):
        self.name, self.shown, self.loading, self.synced = name, [], [], []
        self._compute = compute or (lambda selection, model: f"analysis of {selection.checkpoint} on {model}")

    def set_loading(self, value):
        self.loading.append(value)

    def checkpoint_name(self):
        return self.name

    def sync_and_query(self, model):
        self.synced.append(model)
        return Selection(checkpoint=self.name)

    def compute(self, selection, model):
        return self._compute(selection, model)

    def finish(self, started, analysis, message):
        self.shown.append((analysis, message))


class FakePool:
    def __init__(self, block=None, blocked=None):
        self.acquired, self.released, self.block, self.blocked = [], [], block, blocked
        self.loading = threading.Event()  # set once the blocked model's load has begun

    def acquire(self, name):
        if name == self.blocked:  # loading this one takes until ``block`` is set
            self.loading.set()
            self.block.wait()
        self.acquired.append(name)
        return f"model {name}"

    def release(self, model):
        self.released.append(model)


def test_an_update_shows_its_result_and_releases_the_model():
    pool, view = FakePool(), FakeView()
    updates = Updates(Document(FakeDocument()), pool.acquire, pool.release)
    asyncio.run(updates.run(view))
    assert view.shown == [("analysis of fg on model fg", None)] and view.loading == [True]
    assert pool.released == ["model fg"] and view.synced == ["model fg"]


@pytest.mark.timeout(300)  # the waits are on events; a bug that never sets one fails here instead of hanging
def test_an_update_overtaken_by_a_newer_one_shows_nothing():
    go_on = threading.Event()
    pool = FakePool(block=go_on, blocked="first")
    first, second = FakeView("first"), FakeView("second")
    updates = Updates(Document(FakeDocument()), pool.acquire, pool.release)

    async def both():
        older = asyncio.ensure_future(updates.run(first))
        await asyncio.to_thread(pool.loading.wait)  # the first is loading its model
        await updates.run(second)
        go_on.set()
        await older

    asyncio.run(both())
    assert second.shown == [("analysis of second on model second", None)]
    assert first.shown == [] and first.synced == []  # overtaken while loading: not even fitted
    assert sorted(pool.released) == ["model first", "model second"]


def test_errors_are_messages_and_the_session_keeps_working(caplog):
    pool = FakePool()
    updates = Updates(Document(FakeDocument()), pool.acquire, pool.release)

    def refuse(selection, model):
        raise UserError("pasted text is empty")

    def crash(selection, model):
        raise RuntimeError("boom")

    user, bug, fine = FakeView(compute=refuse), FakeView(compute=crash), FakeView()
    with caplog.at_level(logging.ERROR, logger="fca.dashboard"):
        for view in (user, bug, fine):
            asyncio.run(updates.run(view))
    assert user.shown == [(None, "pasted text is empty")]
    assert bug.shown == [(None, "internal error (RuntimeError: boom); the session keeps working")]
    assert "RuntimeError: boom" in caplog.text and "Traceback" in caplog.text  # the server's log has the bug
    assert fine.shown == [("analysis of fg on model fg", None)]
    assert pool.released == ["model fg"] * 3


def test_an_update_of_a_session_that_went_away_ends_quietly(monkeypatch):
    import fca_workbench.viewmodel.session_updates as session

    monkeypatch.setattr(session, "DOCUMENT_WAIT_SECONDS", 0.05)
    document, pool, view = FakeDocument(runs=False), FakePool(), FakeView()
    asyncio.run(Updates(Document(document), pool.acquire, pool.release).run(view))
    assert document.callbacks == 1 and view.loading == [] and view.shown == [] and pool.acquired == []


def test_outside_a_server_the_document_runs_everything_at_once():
    document, ran = Document(None), []
    assert not document.served and not Document(SimpleNamespace(session_context=None)).served
    document.later(lambda: ran.append("later"))
    assert ran == ["later"] and asyncio.run(document.call(lambda x: x + 1, 1)) == 2


# ------------------------------------------------------------------------------------------------ the split


def _trees(folder: Path) -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text()) for path in sorted(folder.glob("*.py"))}


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def _module_constants(tree: ast.Module) -> set[str]:
    targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in tree.body if isinstance(node, ast.AnnAssign)]
    return {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}


def test_the_view_model_imports_no_panel():
    for name, tree in _trees(VIEW_MODEL).items():
        assert not _imported(tree) & {"panel", "bokeh"}, f"fca_workbench/viewmodel/{name} imports Panel"
    assert (APP / "panel_writes.py").is_file() and not (VIEW_MODEL / "panel_writes.py").exists()


def test_each_dashboard_constant_is_defined_once():
    """SOURCES and ALL_LAYERS once had a value in the app and another in the view model."""
    defined: dict[str, list[str]] = {}
    for folder in (VIEW_MODEL, APP):
        for name, tree in _trees(folder).items():
            for constant in _module_constants(tree):
                defined.setdefault(constant, []).append(f"{folder.name}/{name}")
    twice = {constant: where for constant, where in defined.items() if len(where) > 1}
    assert not twice, twice
    assert defined["SOURCES"] == ["viewmodel/query.py"] and defined["ALL_LAYERS"] == ["viewmodel/query.py"]


def test_serving_logic_is_defined_once_and_not_in_the_app():
    wanted = {
        "ServedSettings",
        "served_settings",
        "serving_auth",
        "basic_auth_option",
        "dashboard_secret",
        "is_loopback",
    }
    where: dict[str, list[str]] = {}
    for path in [*(ROOT / "fca_workbench").rglob("*.py"), *APP.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
                where.setdefault(node.name, []).append(path.relative_to(ROOT).as_posix())
    assert where == {name: ["fca_workbench/viewmodel/serving.py"] for name in wanted}
    for name, tree in _trees(APP).items():
        assert "argparse" not in _imported(tree), f"dashboards/{name} parses settings of its own"


def test_the_app_needs_no_noqa():
    for path in APP.glob("*.py"):
        assert "noqa" not in path.read_text(), path.name


def test_cli_dashboard_namespace_has_every_served_setting():
    from fca_workbench.cli import build_parser

    args = build_parser().parse_args(["dashboard"])
    fields = set(ServedSettings.__dataclass_fields__)
    assert fields <= set(vars(args)) and isinstance(args, argparse.Namespace)


def test_a_download_that_cannot_be_read_names_the_entry_never_the_server_path(tmp_path):
    from fca_workbench.viewmodel.results_folder import ResultsFolder

    (tmp_path / "audit-x").mkdir()
    (tmp_path / "audit-x" / "audit.json").write_text("{}")
    results = ResultsFolder(tmp_path)
    [entry] = results.scan()
    assert results.download(entry, "audit.json") == b"{}"
    (tmp_path / "audit-x" / "audit.json").unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "audit-x" / "audit.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UserError) as error:
        results.download(entry, "audit.json")
    assert (
        str(error.value)
        == "audit-x/audit.json cannot be read now: audit-x/audit.json is a link: only files inside the results folder are read"
    )
    (tmp_path / "audit-x" / "audit.json").unlink()
    with pytest.raises(UserError, match=r"^audit-x/audit.json cannot be read now: audit-x/audit.json is not a file$"):
        results.download(entry, "audit.json")


# ------------------------------------------------------------------------------------------------ saved profiles


@pytest.fixture(scope="module")
def audited(tiny_checkpoints, tmp_path_factory):
    """A results folder with one audit of the tiny FeatureGate on 8 calibration windows, and a checkpoint copy
    whose controller bias holds a NaN."""
    import shutil

    from safetensors.torch import load_file, save_file

    from fca_workbench.audit.run import AuditSettings, run_audit

    root = tmp_path_factory.mktemp("audited")
    folder = tiny_checkpoints["featuregate"]
    settings = AuditSettings(checkpoint=str(folder), window=64, max_windows=8, resamples=20, latency_repeats=1)
    run_audit(settings, root / "results" / "audit")
    poisoned = Path(shutil.copytree(folder, root / "poisoned"))
    weights = load_file(poisoned / "model.safetensors")
    weights["h.1.controller.proj.bias"][0] = float("nan")
    save_file(weights, poisoned / "model.safetensors", metadata={"format": "pt"})
    return folder, root / "results", poisoned


def live_layer_mean(folder, results=None):
    """The live view of ``layer_mean`` on eval window 0, with the profiles of ``results``'s audit if usable."""
    from fca_workbench.viewmodel.inputs import window_input
    from fca_workbench.viewmodel.live import DashboardSession
    from fca_workbench.viewmodel.results_folder import ResultsFolder

    shared = SharedModel(folder, calibration_windows=8, eval_windows=4, results=results and ResultsFolder(results))
    return shared, DashboardSession().analyse("fg", shared, window_input(shared, 0), "layer_mean")


def test_a_flipped_bit_or_garbage_in_saved_profiles_gives_the_recomputed_figures_and_a_note(audited, tmp_path):
    import hashlib
    import shutil

    import numpy as np

    from fca_workbench.results.layout import AUDIT_FILE, PROFILES_FILE

    folder, results, _ = audited
    _, computed = live_layer_mean(folder)  # no results folder: computed here
    shared, saved = live_layer_mean(folder, results)
    assert "fingerprints match" in shared.profiles_source
    assert not [n for n in saved.notes if not n.startswith("no retention:")]  # only an unresolved gap may be noted
    copy = Path(shutil.copytree(results, tmp_path / "results"))
    profiles = copy / "audit" / PROFILES_FILE
    data = bytearray(profiles.read_bytes())
    data[-1] ^= 0x01  # one bit of one profile value
    profiles.write_bytes(bytes(data))
    shared, flipped = live_layer_mean(folder, copy)
    assert "sha256 differs" in shared.profiles_source and "fingerprints match" not in shared.profiles_source
    assert any("sha256 differs" in note for note in flipped.notes)
    np.testing.assert_array_equal(flipped.nll_condition, computed.nll_condition)
    profiles.write_bytes(b"not a safetensors file")
    audit = json.loads((copy / "audit" / AUDIT_FILE).read_text())
    audit["static_profiles"]["sha256"] = hashlib.sha256(b"not a safetensors file").hexdigest()
    (copy / "audit" / AUDIT_FILE).write_text(json.dumps(audit))
    shared, garbage = live_layer_mean(folder, copy)  # no error for the session
    assert "does not parse" in shared.profiles_source
    np.testing.assert_array_equal(garbage.nll_condition, computed.nll_condition)


def test_the_live_view_of_a_model_with_a_nan_weight_is_one_message(audited):
    from fca_workbench.viewmodel.inputs import pasted_input, window_input
    from fca_workbench.viewmodel.live import DashboardSession

    _, _, poisoned = audited
    shared = SharedModel(poisoned, calibration_windows=4, eval_windows=4)
    session = DashboardSession()
    with pytest.raises(UserError, match="non-finite NLL .* condition 'unperturbed' in eval window 2"):
        session.analyse("fg", shared, window_input(shared, 2), "cross_input")
    with pytest.raises(UserError, match="in the pasted text"):
        session.analyse("fg", shared, pasted_input(shared, "To be, or not to be"), "correct")
