"""The benchmarks measure what users run: the replay session (``ReplaySession``), ``run_audit`` /
``audit_model`` or the dashboard's view model, never the steps behind them, so a figure cannot go on
describing a path the session no longer takes."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the audit's steps, which the session calls (and a benchmark must not)
STEPS = {
    "capture",
    "replay_nll",
    "calibration_profiles",
    "static_profiles",
    "per_layer_window_nll",
    "per_layer_sweep",
    "prefix_window_nll",
    "full_forward_window_nll",
    "ConditionCoefficients",
    "PrefixCache",
}


def steps_used(source: str) -> set[str]:
    """The steps ``source`` imports from the package, or reaches as an attribute of an imported module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fca_workbench"):
            found |= {alias.name for alias in node.names if alias.name in STEPS}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.rpartition(".")[2] in STEPS}
        elif isinstance(node, ast.Attribute) and node.attr in STEPS:
            found.add(node.attr)
    return found


def test_no_benchmark_calls_a_step_behind_the_session():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 10 and ROOT / "benchmarks" / "gpu_check.py" in scripts
    offenders = {path.name: sorted(used) for path in scripts if (used := steps_used(path.read_text()))}
    assert offenders == {}, f"benchmarks calling the audit's steps instead of the replay session: {offenders}"


def test_the_scan_sees_each_way_of_reaching_a_step():
    assert steps_used("from fca_workbench.audit.capture import capture, model_fingerprint") == {"capture"}
    assert steps_used("from fca_workbench.audit import prefix\nprefix.PrefixCache(m, ids)") == {"PrefixCache"}
    assert steps_used("import fca_workbench.audit.replay as r\nr.replay_nll(m)") == {"replay_nll"}
    assert steps_used("from fca_workbench.audit.session import ReplaySession\nReplaySession(m, {})") == set()
