"""The replay session: the method in one place, and conditions asked, never named by hand.

Two source scans keep it so: no module outside the session and the method's own step modules calls a step
(capture, calibration profiles, assignment, replay, the sweep), and no module outside the vocabulary spells a
condition's name. The session's answers are checked against the audit's own figures and against replays
computed here by hand.
"""

import ast
from pathlib import Path

import pytest
import torch

from fca_workbench.audit.inputs import CALIBRATION, EVAL
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import next_token_nll
from fca_workbench.results.conditions import (
    ALL_CONDITIONS,
    BOTTOM,
    CONDITIONS,
    CORRECT,
    LIVE_RUN,
    LOW,
    REFERENCE,
    TOP,
    VOCABULARY,
    condition_named,
)

PACKAGE = Path(__file__).resolve().parent.parent / "fca_workbench"
DASHBOARDS = PACKAGE.parent / "dashboards"

# the method's steps, and the modules allowed to call them: the session, and the steps calling each other
STEPS = {
    "capture": {"audit/session.py"},
    "calibration_profiles": {"audit/session.py"},
    "profiles_of": {"audit/session.py", "audit/assignment.py"},
    "replay_nll": {"audit/session.py", "audit/sweep.py"},
    "per_layer_window_nll": {"audit/session.py", "audit/sweep.py"},
    "per_layer_sweep": set(),
    "ConditionCoefficients": {"audit/session.py", "audit/replay.py", "audit/sweep.py"},
    "assigned_values": {"audit/session.py", "audit/assignment.py", "audit/text_replay.py"},
    "static_values": {"audit/session.py", "audit/assignment.py"},
    "routing_top_k": {"audit/session.py", "audit/assignment.py"},
}


def calls(path: Path) -> set[str]:
    """The workbench functions and classes ``path`` imports by name and calls (a method of the same name on
    some object, ``prefix.replay_nll``, is not a step)."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fca_workbench")
        for alias in node.names
    }
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    return called & imported


def sources() -> list[tuple[str, Path]]:
    package = [(str(p.relative_to(PACKAGE)), p) for p in sorted(PACKAGE.rglob("*.py"))]
    return package + [(f"dashboards/{p.name}", p) for p in sorted(DASHBOARDS.glob("*.py"))]


ENGINE_NAMES = ("PrefixCache", "PrefixStore", "replay_nll", "replay_nll_many", "replay_run", "forward_nll")


def test_no_module_outside_the_engine_replays_or_holds_a_prefix_cache():
    """The frozen replay (full, per layer, one text) lives in ``audit/``, over the models' own seam (``models/``,
    ``adapters/``): a surface that built a prefix cache or ran a frozen forward itself would be a fourth engine."""
    offenders = []
    for name, path in sources():
        if name.split("/")[0] in ("audit", "adapters", "models"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if named in ENGINE_NAMES:
                offenders.append(f"{name}:{node.lineno} {named}")
    assert not offenders, offenders


def test_only_the_session_runs_the_methods_steps():
    """A surface (run_audit, the mini-audit, the explorer, the dashboard, fca eval, fca export, ...) that
    captured, estimated profiles or replayed by itself would be a second copy of the method."""
    offenders = {
        f"{name} calls {step}"
        for name, path in sources()
        for step in calls(path) & set(STEPS)
        if name not in STEPS[step]
    }
    assert not offenders, sorted(offenders)


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal of ``path`` but docstrings, with its line."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_condition_is_named_outside_the_vocabulary():
    """Code asks a condition what it is; a figure of one named condition is read through the vocabulary's
    names (``CORRECT``, ``LOW``, ...). A literal ``"cross_input"`` anywhere else would be a hand-made branch."""
    names = set(ALL_CONDITIONS)
    spelled = [
        f"{name}:{line} {value!r}"
        for name, path in sources()
        if name != "results/conditions.py"
        for line, value in string_constants(path)
        if value in names
    ]
    assert not spelled, spelled


def test_every_condition_declares_its_behaviour():
    """One live run, one reference and one low end of the gap; every other condition an intervention whose
    assignment replay knows; the names the code reads are the vocabulary's own."""
    assert [c.name for c in VOCABULARY if c.live] == [LIVE_RUN]
    assert [c.name for c in VOCABULARY if c.retention_end == TOP] == [REFERENCE] == [CORRECT]
    assert [c.name for c in VOCABULARY if c.retention_end == BOTTOM] == [LOW]
    assert all(c.intervention != c.baseline for c in VOCABULARY)
    assert {c.name for c in VOCABULARY if c.needs_donor} == {"cross_input"}
    assert all(c.static == (c.kind == "profile") for c in VOCABULARY)
    with pytest.raises(UserError, match="unknown condition 'layer_median'"):
        condition_named("layer_median")


@pytest.fixture(scope="module")
def audited(tiny_checkpoints, tmp_path_factory):
    """A FeatureGate audit and a session opened on the same settings and cache."""
    root = tmp_path_factory.mktemp("session")
    settings = AuditSettings(
        str(tiny_checkpoints["featuregate"]), window=32, max_windows=6, batch_size=2, resamples=50, latency_repeats=1
    )
    audit = run_audit(settings, root / "audit")
    return audit, settings, root / "audit"


def test_a_session_answers_what_the_audit_reported(audited):
    """The session opened on an audit's settings and cache (its captures reused) gives every condition's NLL
    the audit reported, and its conditions are the audit's."""
    audit, settings, out = audited
    session = ReplaySession.open(settings, out)
    assert session.conditions == CONDITIONS
    for condition in session.conditions:
        nll = session.nll(condition).double().mean(dim=1).mean().item()
        assert nll == pytest.approx(audit["conditions"][condition]["nll"], abs=1e-9)


def test_one_windows_replay_is_the_frozen_model_fed_by_hand(audited):
    """``window_nll`` of one window under a static profile is the frozen model fed that profile at every
    position, computed here without the session; the live run is the cached NLL."""
    _, settings, out = audited
    session = ReplaySession.open(settings, out)
    window = torch.tensor([3])
    ids = session.windows(EVAL)[window]
    profile = session.profiles["layer_mean"]
    slots = session.model.coefficient_slot_shapes
    fed = [{"coefficient": p.expand(1, ids.shape[1], *slot).float()} for p, slot in zip(profile, slots)]
    with torch.no_grad():
        expected = next_token_nll(session.model.replay_run(ids, fed), ids)
    torch.testing.assert_close(session.window_nll("layer_mean", window), expected, rtol=0, atol=1e-6)
    assert torch.equal(session.window_nll(LIVE_RUN, window), session.eval_cache.nll(window))


def test_a_session_computes_only_what_it_is_asked(audited, tmp_path):
    """Asking for the calibration profiles never captures the eval windows (``fca eval``, ``fca export``),
    and opening a session for exploration reads no calibration text."""
    _, settings, _ = audited
    settings = AuditSettings(**{**settings.__dict__, "cache": str(tmp_path / "cache")})
    session = ReplaySession.open(settings, read_now=(CALIBRATION,))
    assert set(session.profiles) >= {"global_mean", "layer_mean"}
    assert not (tmp_path / "cache" / EVAL).exists() and (tmp_path / "cache" / CALIBRATION).is_dir()
    explorer = ReplaySession.open(settings, read_now=(EVAL,))
    assert CALIBRATION not in explorer._read


def test_a_condition_the_model_does_not_replay_is_one_line(audited):
    _, settings, out = audited
    session = ReplaySession.open(settings, out)
    with pytest.raises(UserError, match="only for models whose controllers are top-k routers"):
        session.check_condition("layer_mean_topk")
    with pytest.raises(UserError, match="is not one of its conditions"):
        session.check_condition("layer_median")


def test_one_audits_retention_table_shows_every_profile_it_has(tmp_path):
    """The dashboard's detail view of a router audit shows ``layer_mean_topk`` beside the other profiles (the
    overview names it an MoE audit's best profile); the paper's table across models keeps the common ones."""
    from fca_workbench.foundation.resources import checkpoints_dir
    from fca_workbench.results.retention_tables import retention_table
    from fca_workbench.viewmodel.results_folder import audit_tables

    settings = AuditSettings(
        str(checkpoints_dir() / "moe-s0"), window=32, max_windows=4, batch_size=2, resamples=20, latency_repeats=1
    )
    audit = run_audit(settings, tmp_path / "moe")
    assert "layer_mean_topk" not in retention_table([audit]).columns
    (detail,) = [t for t in audit_tables(audit) if "layer_mean" in t.columns]
    assert detail["layer_mean_topk"].tolist() == [audit["retention"]["layer_mean_topk"]["value"]]
