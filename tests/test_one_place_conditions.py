"""One place per concept: the condition vocabulary (``results/conditions.py``), what a condition assigns
(``audit.conditions.assigned_values``) and the audit line (the mini-audit is the audit's own steps)."""

import ast
import math
from pathlib import Path

import jsonschema
import pytest
import torch

from fca_workbench.adapters import COEFFICIENT
from fca_workbench.audit import assignment
from fca_workbench.audit.mini import MiniAudit
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.cli import build_parser
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.results.conditions import (
    ALL_CONDITIONS,
    REASSIGNMENTS,
    RETAINED,
    VOCABULARY,
    condition_names,
    conditions_epilog,
)
from fca_workbench.results.schema import audit_json_schema, validate_audit

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY_MODULE = ROOT / "fca_workbench" / "results" / "conditions.py"


def spelled_collections(folder: Path) -> list[str]:
    """``file:line`` of every tuple, list, set or dict literal that holds two or more condition names as string
    constants, outside the vocabulary module. A dict counts by its values, or by its keys when every value is a
    constant (a table about the conditions, like their help); a dict of computed figures keyed by name (the
    profiles, the NLLs a retention is computed from) is data, not a second vocabulary."""
    names = set(ALL_CONDITIONS)
    found = []
    for path in sorted(folder.rglob("*.py")):
        if path == VOCABULARY_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                groups = [node.elts]
            elif isinstance(node, ast.Dict):  # a table of constants keyed by name (help text), or names as values
                constant = all(isinstance(v, ast.Constant) for v in node.values)
                groups = [[k for k in node.keys if k is not None] if constant else [], node.values]
            else:
                continue
            for group in groups:
                spelled = [e.value for e in group if isinstance(e, ast.Constant) and e.value in names]
                if len(spelled) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {spelled}")
    return found


def test_no_collection_of_condition_names_outside_the_vocabulary_in_the_package():
    assert spelled_collections(ROOT / "fca_workbench") == []


def test_no_collection_of_condition_names_in_the_dashboard_app():
    assert spelled_collections(ROOT / "dashboards") == []


def test_the_scan_finds_a_spelled_collection(tmp_path):
    (tmp_path / "copy.py").write_text('SEEDED = ("cross_input", "token_shuffle")\nONE = ("layer_mean",)\n')
    (tmp_path / "help.py").write_text('HELP = {"correct": "own", "layer_mean": "static"}\n')
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert [f.split()[0] for f in spelled_collections(tmp_path)] == ["copy.py:1", "help.py:1"]
    finally:
        ROOT = root


def test_every_condition_has_help_and_the_cli_lists_it():
    assert all(c.help for c in VOCABULARY) and condition_names()[: len(ALL_CONDITIONS)] == ALL_CONDITIONS
    seeded = tuple(c.name for c in VOCABULARY if c.seeded)
    assert REASSIGNMENTS == seeded == ("cross_input", "same_token", "token_shuffle", "causal_shuffle")
    assert all(c.intervention for c in VOCABULARY if c.seeded)
    audit_help = build_parser()._subparsers._group_actions[0].choices["audit"].format_help()
    assert conditions_epilog() in audit_help
    for condition in VOCABULARY:
        assert f"{condition.name}  " in audit_help and condition.help in audit_help


def section_validator(section: str):
    """A validator of one section of ``audit.json`` against the schema the workbench validates with."""
    schema = audit_json_schema()
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], **schema["properties"][section]})


def test_the_schema_accepts_condition_names_and_nothing_else():
    """Any name a condition may be registered under (a registered one is read by a process that never registered
    it), and nothing that could not be one."""
    figure = {"nll": 1.0, "ci95": [0.9, 1.1], "delta": 0.0, "delta_ci95": [0.0, 0.0]}
    retention = {"value": 0.5, "ci95": [0.4, 0.6]}
    conditions, retained = section_validator("conditions"), section_validator("retention")
    assert conditions.is_valid({name: figure for name in ALL_CONDITIONS})
    assert retained.is_valid({name: retention for name in RETAINED})
    assert conditions.is_valid({"layer_median": figure})
    for name in ("Layer median", "", "x" * 49, "1st", "a-b", "=SUM(1)"):
        assert not conditions.is_valid({name: figure}) and not retained.is_valid({name: retention}), name
    with pytest.raises(jsonschema.ValidationError, match="Layer median"):
        validate_audit({"schema": "fca-audit/1", "conditions": {"Layer median": figure}})


# ------------------------------------------------------------------------------------------------------
# what a condition assigns: one function for the cache (audit) and for prefixes (dashboard)


ASSIGNMENT_PARTS = (
    "position_permutations",
    "causal_positions",
    "shuffle_positions",
    "broadcast_profile",
    "derangement",
)


def test_only_the_one_function_assembles_what_a_condition_assigns():
    """The pieces of an assignment (``interventions``) are put together in ``audit/conditions.py`` alone; the
    dashboard and the explorer call ``assigned_values`` (a derangement may also be drawn for a donor's index)."""
    callers = {}
    for path in sorted((ROOT / "fca_workbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) in ASSIGNMENT_PARTS
            ):
                callers.setdefault(node.func.id if isinstance(node.func, ast.Name) else node.func.attr, set()).add(
                    str(path.relative_to(ROOT / "fca_workbench"))
                )
    assert callers.pop("derangement") <= {"audit/assignment.py", "audit/session.py"}
    assert all(files == {"audit/assignment.py"} for files in callers.values()), callers


def test_assigned_values_of_each_kind():
    import fca_workbench.audit.text_replay as text_replay

    assert text_replay.assigned_values is assignment.assigned_values  # what the dashboard's live view replays
    real = assignment.assigned_values
    own = [{COEFFICIENT: torch.arange(12.0).view(1, 6, 2)}]
    donor = [{COEFFICIENT: -torch.arange(16.0).view(1, 8, 2)}]
    assert real("correct", own, None, None, [(2,)], torch.tensor([0]), 0) is own
    crossed = real("cross_input", own, lambda: donor, None, [(2,)], torch.tensor([0]), 0)
    assert torch.equal(crossed[0][COEFFICIENT], donor[0][COEFFICIENT][:, :6])  # causal: a prefix of the donor
    shuffled = real("token_shuffle", own, None, None, [(2,)], torch.tensor([3]), 5)[0][COEFFICIENT]
    assert sorted(shuffled[0, :, 0].tolist()) == own[0][COEFFICIENT][0, :, 0].tolist()
    assert not torch.equal(shuffled, own[0][COEFFICIENT])
    profile = real("layer_mean", own, None, {"layer_mean": [torch.tensor([7.0, 8.0])]}, [(2,)], torch.tensor([0]), 0)
    assert profile[0][COEFFICIENT].shape == (1, 6, 2) and profile[0][COEFFICIENT][0, 5].tolist() == [7.0, 8.0]
    with pytest.raises(UserError, match="unknown condition"):
        real("layer_median", own, None, None, [(2,)], torch.tensor([0]), 0)


# ------------------------------------------------------------------------------------------------------
# the audit line: the mini-audit is the audit's own steps on fewer windows


MISSING = object()


def audit_value(audit: dict, key: str):
    """The ``audit.json`` figure a mini-audit column names (``MISSING``: the audit reports no such figure)."""
    bound = {"": 0, "_lo": 0, "_hi": 1}
    for suffix in ("_lo", "_hi", ""):
        stem = key.removesuffix(suffix) if suffix else key
        if suffix and stem == key:
            continue
        if stem == "nll_correct" and not suffix:
            return audit["conditions"]["correct"]["nll"]
        if stem.startswith("delta_") and stem.removeprefix("delta_") in audit["conditions"]:
            figure = audit["conditions"][stem.removeprefix("delta_")]
            return figure["delta"] if not suffix else figure["delta_ci95"][bound[suffix]]
        if stem.startswith("retention_") and stem.removeprefix("retention_") in audit["retention"]:
            figure = audit["retention"][stem.removeprefix("retention_")]
            return figure["value"] if not suffix else figure["ci95"][bound[suffix]]
    for section in ("variance", "variation", "execution"):
        if key in audit[section]:
            return audit[section][key]
    return MISSING


def assert_mini_audit_equals_the_audit(folder, model, tmp_path) -> dict:
    settings = AuditSettings(
        checkpoint=str(folder), window=16, max_windows=6, batch_size=3, resamples=50, latency_repeats=1, seed=3
    )
    audit = run_audit(settings, tmp_path / "audit")
    session = ReplaySession.open(settings)
    eval_windows, calib_windows = session.windows("eval"), session.windows("calibration")
    mini = MiniAudit(eval_windows, calib_windows, seed=3, batch_size=3, resamples=50)(model)
    for key, value in mini.items():
        expected = audit_value(audit, key)
        assert expected is not MISSING, f"the mini-audit reports {key}, which audit.json does not"
        if expected is None or math.isnan(value):
            assert math.isnan(value) and expected is None, (key, value, expected)
        else:
            assert math.isclose(value, expected, rel_tol=0, abs_tol=1e-9), (key, value, expected)
    return audit


def test_mini_audit_of_a_featuregate_equals_the_audit(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    audit = assert_mini_audit_equals_the_audit(folder, load_model(folder), tmp_path)
    assert list(audit["retention"]) == ["layer_mean", "layer_scalar", "layer_position_mean", "layer_token_mean"]


def test_mini_audit_of_a_router_model_equals_the_audit_which_reports_layer_mean_topk(tiny_mixtral, tmp_path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_mixtral)
    audit = assert_mini_audit_equals_the_audit(tiny_mixtral, model, tmp_path)
    assert "layer_mean_topk" in audit["retention"] and "layer_mean_topk" in audit["conditions"]
