"""A condition written outside the package runs through every surface like a built-in one: the audit and its
per-layer sweep, the report, ``audit.json``, the dashboard's live view, ``fca export`` (a static one) and, through a
package's entry point, the ``fca`` command; and a model held in memory audits like its folder."""

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import fca
from transformers import AutoModelForCausalLM, AutoTokenizer

from fca_workbench import Condition, audit_model, register_condition, run_audit
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.cli import main as fca_main
from fca_workbench.data.windows import load_windows
from fca_workbench.export.sources import calibration_profile
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.models import load_model
from fca_workbench.results.conditions import condition_names, conditions_epilog, unregister_condition
from fca_workbench.results.report import format_report

# A researcher's own module, outside the package: one reassignment (each window's own coefficients, positions
# reversed) and one static condition (half the static layerwise profile), written with the public API only.
USER_MODULE = """
from fca_workbench import condition


@condition("reversed_positions", "the window's own values, positions reversed")
def reversed_positions(assignment):
    return [{name: t.flip(1) for name, t in value.items()} for value in assignment.own]


@condition("half_layer_mean", "half the static layerwise profile", "profile", retention=True)
def half_layer_mean(assignment):
    return [{name: 0.5 * t for name, t in value.items()} for value in assignment.profile("layer_mean")]
"""
USER_CONDITIONS = ("reversed_positions", "half_layer_mean")
SETTINGS = dict(window=16, max_windows=4, batch_size=2, resamples=50, latency_repeats=1)


@pytest.fixture
def user_conditions(tmp_path):
    """The user's module imported from its own folder; its conditions taken out of the registry afterwards."""
    path = tmp_path / "my_conditions.py"
    path.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location("my_conditions", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    try:
        yield
    finally:
        for name in USER_CONDITIONS:
            unregister_condition(name)
    assert not set(USER_CONDITIONS) & set(condition_names())


def reference_nll(model, windows, **coefficients) -> float:
    """Mean over windows of each window's mean next-token NLL, as the audit averages it, from the model's own
    forward, computed here rather than by the workbench."""
    with torch.no_grad():
        logits = model(windows, **coefficients).logits
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), windows[:, 1:], reduction="none")
    return nll.double().mean(dim=1).mean().item()


def audit_windows(audit: dict, folder) -> torch.Tensor:
    """The audit's eval windows, read again and checked against the fingerprint it recorded."""
    data = audit["data"]["eval"]
    windows = load_windows(data["source"], AutoTokenizer.from_pretrained(folder), data["window"], data["windows"])
    assert fingerprint_tensor(windows) == data["fingerprint"]
    return windows


def test_a_user_condition_runs_through_the_audit_sweep_report_and_export(user_conditions, tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    settings = AuditSettings(checkpoint=str(folder), per_layer=True, **SETTINGS)
    audit = run_audit(settings, tmp_path / "audit")
    assert audit is not None
    assert list(audit["conditions"])[-2:] == list(USER_CONDITIONS)
    assert list(audit["retention"])[-1] == "half_layer_mean"
    swept = {row["condition"] for row in audit["per_layer"]}
    assert set(USER_CONDITIONS) <= swept
    report = format_report(audit)
    assert "reversed_positions" in report and "ret. half_layer_mean" in report
    assert (
        json.loads((tmp_path / "audit" / "audit.json").read_text())["conditions"].keys() == audit["conditions"].keys()
    )

    model = load_model(folder).eval()
    windows = audit_windows(audit, folder)
    with torch.no_grad():
        own = model(windows, return_coefficients=True).coefficients
    expected = reference_nll(model, windows, coefficients=[c.flip(1) for c in own])
    assert audit["conditions"]["reversed_positions"]["nll"] == pytest.approx(expected, abs=1e-5, rel=0)

    session = ReplaySession.open(AuditSettings(checkpoint=str(folder), **SETTINGS), read_now=())
    half = calibration_profile(session, "half_layer_mean").layers
    assert [h.tolist() for h in half] == [(0.5 * p).tolist() for p in session.profiles["layer_mean"]]
    exported = tmp_path / "export"
    argv = ["export", str(folder), "--profile", "half_layer_mean", "--audit", str(tmp_path / "audit")]
    assert fca_main([*argv, "--out", str(exported)]) == 0
    static = AutoModelForCausalLM.from_pretrained(exported).eval()  # plain transformers: the gates folded in
    assert reference_nll(static, windows) == pytest.approx(audit["conditions"]["half_layer_mean"]["nll"], abs=1e-5)


def test_a_user_condition_in_the_dashboards_live_view(user_conditions, tiny_checkpoints):
    """The live view offers the registered conditions and replays them as the model's own forward does."""
    from fca_workbench.viewmodel.live import DashboardSession, SharedModel, window_input

    folder = tiny_checkpoints["featuregate"]
    shared = SharedModel(folder, calibration_windows=4, eval_windows=4)
    assert set(USER_CONDITIONS) <= set(shared.conditions)
    model = load_model(folder).eval()
    ids = shared.eval_windows[1:2]
    with torch.no_grad():
        own = model(ids, return_coefficients=True).coefficients
    half = [0.5 * p.expand_as(c) for p, c in zip(shared.session.profiles["layer_mean"], own)]
    for condition, coefficients in (("reversed_positions", [c.flip(1) for c in own]), ("half_layer_mean", half)):
        analysis = DashboardSession().analyse("fg", shared, window_input(shared, 1), condition)
        with torch.no_grad():
            logits = model(ids, coefficients=coefficients).logits
        expected = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")
        assert analysis.condition == condition
        torch.testing.assert_close(torch.as_tensor(analysis.nll_condition).float(), expected, rtol=0, atol=1e-5)


def test_registration_mistakes_are_one_line(user_conditions, tiny_checkpoints, tmp_path):
    def own(assignment):
        return assignment.own

    for bad, fragment in (
        (Condition("Bad Name", "x", "reassignment", own), "must match"),
        (Condition("live_again", "x", "live", own), "kind must be one of"),
        (Condition("no_function", "x", "profile", None), "assign must be a function"),
        (Condition("reversed_positions", "other", "reassignment", own), "already registered"),
    ):
        with pytest.raises(UserError, match=fragment):
            register_condition(bad)

    def wrong_shape(assignment):
        return [{"coefficient": value["coefficient"][:, :1]} for value in assignment.own]

    register_condition(Condition("wrong_shape", "returns one position only", "reassignment", wrong_shape))
    try:
        settings = AuditSettings(checkpoint=str(tiny_checkpoints["featuregate"]), **SETTINGS)
        with pytest.raises(UserError, match="condition 'wrong_shape' gave controller 0 a coefficient of"):
            run_audit(settings, tmp_path / "audit")
    finally:
        unregister_condition("wrong_shape")


def test_a_packages_entry_point_brings_its_conditions_to_the_fca_command(tiny_checkpoints, tmp_path, monkeypatch):
    """Installed the way a package is (a dist-info with an ``fca_workbench_conditions`` entry point), the module's
    conditions are in ``fca audit --help`` and in every audit the command writes."""
    site = tmp_path / "site"
    info = site / "lab_conditions-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "lab_conditions.py").write_text(USER_MODULE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-conditions\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fca_workbench_conditions]\nlab = lab_conditions\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    helped = fca("audit", "--help")
    assert "reversed_positions" in helped.stdout and "half the static layerwise profile" in helped.stdout
    out = tmp_path / "audit"
    flags = ["--window", "16", "--max-windows", "4", "--resamples", "50", "--latency-repeats", "1"]
    result = fca("audit", tiny_checkpoints["featuregate"], *flags, "--out", out)
    assert result.returncode == 0, result.stderr
    audit = json.loads((out / "audit.json").read_text())
    assert set(USER_CONDITIONS) <= set(audit["conditions"]) and "half_layer_mean" in audit["retention"]
    assert "reversed_positions" in result.stdout
    assert "reversed_positions" not in conditions_epilog()  # this process never loaded the package


def test_a_model_in_memory_audits_like_its_folder(tiny_checkpoints, tiny_mixtral, tmp_path):
    """The same figures, digit for digit, and the same fingerprint as the audit of the folder it was loaded from:
    a workbench model and a transformers one."""
    import transformers

    from fca_workbench.data.tokenizer import load_tokenizer

    for name, folder, model in (
        ("featuregate", tiny_checkpoints["featuregate"], load_model(tiny_checkpoints["featuregate"])),
        ("mixtral", tiny_mixtral, transformers.AutoModelForCausalLM.from_pretrained(tiny_mixtral)),
    ):
        by_folder = run_audit(AuditSettings(checkpoint=str(folder), **SETTINGS), tmp_path / f"{name}-folder")
        in_memory = audit_model(
            model.eval(), load_tokenizer(folder), tmp_path / f"{name}-memory", name=name, **SETTINGS
        )
        assert by_folder is not None
        assert in_memory["model"]["fingerprint"] == by_folder["model"]["fingerprint"]
        assert in_memory["model"]["path"] == f"memory:{name}"
        assert in_memory["conditions"] == by_folder["conditions"] and in_memory["retention"] == by_folder["retention"]
    with pytest.raises(UserError, match="cannot audit a Linear"):
        audit_model(torch.nn.Linear(2, 2), load_tokenizer(), tmp_path / "linear")


def test_only_static_conditions_apply_to_any_text(user_conditions):
    from fca_workbench.audit.assignment import static_values

    with pytest.raises(UserError, match="only static profiles apply to any text"):
        static_values("reversed_positions", {}, [(2,)], 1, 4)
    values = static_values("half_layer_mean", {"layer_mean": [torch.tensor([2.0, 4.0])]}, [(2,)], 3, 5)
    assert values[0]["coefficient"].shape == (3, 5, 2) and values[0]["coefficient"][2, 4].tolist() == [1.0, 2.0]


def test_a_user_condition_in_the_explorer_and_on_any_text(user_conditions, tiny_checkpoints, tmp_path):
    """The explorer offers and replays a registered condition as the audit does; a registered static condition
    applies to any text (what ``fca eval`` replays on a task's texts) as the model's own forward with it."""
    from fca_workbench.downstream.frozen import ConditionLogits
    from fca_workbench.explore import Explorer

    folder = tiny_checkpoints["featuregate"]
    settings = AuditSettings(checkpoint=str(folder), cache=str(tmp_path / "cache"), **SETTINGS)
    explorer = Explorer(settings)
    assert set(USER_CONDITIONS) <= set(explorer.conditions)
    model = load_model(folder).eval()
    window = explorer.session.windows("eval")[2:3]
    with torch.no_grad():
        own = model(window, return_coefficients=True).coefficients
        logits = model(window, coefficients=[c.flip(1) for c in own]).logits
    expected = F.cross_entropy(logits[0, :-1].float(), window[0, 1:], reduction="none")
    torch.testing.assert_close(explorer.token_nll("reversed_positions", 2).float(), expected, rtol=0, atol=1e-5)

    text = torch.tensor([[5, 17, 3, 99, 42, 8]])
    half = [0.5 * p.expand(1, 6, *p.shape) for p in explorer.session.profiles["layer_mean"]]
    with torch.no_grad():
        expected_logits = model(text, coefficients=half).logits
    torch.testing.assert_close(
        ConditionLogits(explorer.session, "half_layer_mean")(text), expected_logits, rtol=0, atol=1e-5
    )
