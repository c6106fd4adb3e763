"""The controller-design options of ``fca train`` (issue 27), the study that runs them, and its results.

Each option trains for 2 steps, saves, reloads as the same variant, and audits; the default run still gives
the weights today's trainer gave; ``studies/controller_design.py`` runs, summarises and resumes; the study's
tables and notebook 09 equal an independent read of its committed files, and a broken run folder is one line.
"""

import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import assert_one_line_error, fca
from safetensors.torch import load_file

from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.cli import build_parser
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows, read_documents
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.models.featuregate import GATE_INPUTS, GATE_RANGES
from fca_workbench.notebooks import reproduce
from fca_workbench.results.design_study import design_points, design_runs_table, design_seed_table, read_design_study
from fca_workbench.training.train import TrainSettings, build_model, coefficient_summary, parameter_groups, train

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    """The first 40,000 characters of the calibration split (the text the expectation below was trained on)."""
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:40_000], encoding="utf-8")
    return str(path)


def two_steps(small_text, **overrides) -> TrainSettings:
    fixed = dict(arch="featuregate", layers=2, width=32, heads=4, window=32, batch_size=8, lr=1e-2, warmup=5)
    return TrainSettings(train_data=small_text, steps=2, save_every=10, eval_windows=4, **{**fixed, **overrides})


def test_a_default_run_gives_the_weights_of_the_trainer_before_the_design_options(small_text, tmp_path):
    """Figures of this 2-step run as the trainer gave them before the options existed (commit 1812562); the
    same run with every option spelled out at its default value gives bit-identical weights."""
    card = train(two_steps(small_text), tmp_path / "default")
    weights = load_file(tmp_path / "default" / "model.safetensors")
    rows = (tmp_path / "default" / "train_log.csv").read_text().splitlines()[1:]
    assert [row.split(",")[1] for row in rows] == ["8.31012", "8.26390"]
    assert card["eval_nll"] == 8.1819
    assert sum(w.double().sum().item() for w in weights.values()) == pytest.approx(151.5826297675996, rel=1e-6)
    assert sum(w.double().pow(2).sum().item() for w in weights.values()) == pytest.approx(222.0229930350255, rel=1e-6)
    controller = sum(w.double().abs().sum().item() for k, w in weights.items() if "controller" in k)
    assert controller == pytest.approx(1.984679395915009, rel=1e-6)

    spelled = two_steps(
        small_text, gate_range="2sigmoid", gate_input="normed", controller_weight_decay=0.1, controller_lr_mult=1.0
    )
    train(spelled, tmp_path / "spelled")
    again = load_file(tmp_path / "spelled" / "model.safetensors")
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)


OPTIONS = {
    "range-sigmoid": dict(gate_range="sigmoid"),
    "range-1tanh": dict(gate_range="1+tanh"),
    "input-raw": dict(gate_input="raw"),
    "input-detached": dict(gate_input="detached"),
    "groups-per-channel": dict(gate_groups=32),  # the full width
    "cwd-0": dict(controller_weight_decay=0.0),
    "cwd-10x": dict(controller_weight_decay=1.0),
    "clr-10": dict(controller_lr_mult=10.0),
}


def gates_by_hand(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Layer 0's gates from the weights and the config's formula, written out independently of the model."""
    h = model.embed(input_ids)
    config, proj = model.config, model.gated_blocks[0].controller.proj
    x = h if config.gate_input == "raw" else h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + torch.finfo().eps)
    z = x @ proj.weight.T + proj.bias
    gate = {"2sigmoid": 2 / (1 + torch.exp(-z)), "sigmoid": 1 / (1 + torch.exp(-z)), "1+tanh": 1 + torch.tanh(z)}
    return gate[config.gate_range].unflatten(-1, (2, config.gate_groups))


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_trains_saves_reloads_as_its_variant_and_audits(option, small_text, tmp_path):
    settings = two_steps(small_text, **OPTIONS[option])
    card = train(settings, tmp_path / "run")
    assert card["settings"] | OPTIONS[option] == card["settings"]
    model = load_model(tmp_path / "run").eval()
    for field in ("gate_range", "gate_input", "gate_groups"):
        if field in OPTIONS[option]:
            assert getattr(model.config, field) == OPTIONS[option][field]
    windows = load_windows(split_path("eval"), load_tokenizer(tmp_path / "run"), 32, 4)
    nll, within_std = coefficient_summary(model, windows)  # the trained model's figures, from the reloaded one
    assert (round(nll, 4), round(within_std, 4)) == (card["eval_nll"], card["within_layer_coefficient_std"])
    with torch.no_grad():
        out = model(windows[:2], return_coefficients=True)
        torch.testing.assert_close(out.coefficients[0], gates_by_hand(model, windows[:2]))

    audit = run_audit(
        AuditSettings(str(tmp_path / "run"), max_windows=4, resamples=50, latency_repeats=1), tmp_path / "a"
    )
    groups = model.config.gate_groups
    labels = [f"{branch} g{g}" for branch in ("attn", "mlp") for g in range(groups)]
    assert audit["model"]["slot_labels"] == [labels, labels]
    assert audit["model"]["controllers"] == ["h.0.controller", "h.1.controller"]
    assert "layer_mean" in audit["retention"] and audit["variance"]["r2_layer"] is not None


def test_untrained_gates_start_at_one_except_plain_sigmoid_at_a_half(small_text):
    ids = torch.arange(16).unsqueeze(0)
    for gate_range in GATE_RANGES:
        model = build_model(two_steps(small_text, gate_range=gate_range), load_tokenizer())
        gates = torch.cat(model(ids, return_coefficients=True).coefficients)
        assert torch.all(gates == (0.5 if gate_range == "sigmoid" else 1.0)), gate_range


def test_a_detached_controller_sends_no_gradient_into_the_hidden_state(small_text):
    """With ``detached`` input, d(gates)/dh is zero; with ``normed`` and ``raw`` it is not."""
    for gate_input in GATE_INPUTS:
        model = build_model(two_steps(small_text, gate_input=gate_input), load_tokenizer())
        controller = model.gated_blocks[0].controller
        torch.nn.init.normal_(controller.proj.weight)
        h = torch.randn(1, 4, 32, requires_grad=True)
        controller(h).sum().backward()
        reaches = h.grad is not None and bool(h.grad.abs().sum() > 0)
        assert reaches == (gate_input != "detached"), gate_input
        assert controller.proj.weight.grad.abs().sum() > 0  # the controller itself still learns


def test_controller_optimizer_groups_carry_their_own_decay_and_learning_rate(small_text):
    model = build_model(two_steps(small_text), load_tokenizer())
    controller_ids = {id(p) for c in model.controllers for p in c.parameters()}
    default = parameter_groups(model, two_steps(small_text))
    assert [g["weight_decay"] for g in default] == [0.1, 0.0] and all("lr" not in g for g in default)

    groups = parameter_groups(model, two_steps(small_text, controller_weight_decay=0.0, controller_lr_mult=10.0))
    assert len(groups) == 4
    assert {id(p) for g in groups[2:] for p in g["params"]} == controller_ids
    assert not controller_ids & {id(p) for g in groups[:2] for p in g["params"]}
    assert [(g["weight_decay"], g.get("lr")) for g in groups] == [(0.1, None), (0.0, None), (0.0, 0.1), (0.0, 0.1)]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_muddpythia_controllers_take_the_optimizer_options_too(small_text, tmp_path):
    settings = two_steps(small_text, arch="muddpythia", controller_weight_decay=0.0, controller_lr_mult=2.0)
    model = build_model(settings, load_tokenizer())
    groups = parameter_groups(model, settings)
    assert {id(p) for g in groups[2:] for p in g["params"]} == {
        id(p) for c in model.controllers for p in c.parameters()
    }
    assert all(g["lr"] == 0.02 for g in groups[2:])
    card = train(settings, tmp_path / "run")
    assert card["settings"]["controller_lr_mult"] == 2.0


def test_the_cli_offers_exactly_the_model_choices():
    actions = {a.dest: a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions}
    assert tuple(actions["gate_range"].choices) == tuple(GATE_RANGES)
    assert tuple(actions["gate_input"].choices) == GATE_INPUTS


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--arch", "dense", "--gate-range", "sigmoid"], "--gate-range shape FeatureGate controllers; dense has none"),
        (["--arch", "dense", "--controller-lr-mult", "2"], "need a model with controllers; dense has none"),
        (["--arch", "featuregate", "--controller-lr-mult", "0"], "argument --controller-lr-mult: must be above 0"),
        (
            ["--arch", "featuregate", "--controller-weight-decay", "-1"],
            "argument --controller-weight-decay: must be at",
        ),
        (["--arch", "featuregate", "--controller-weight-decay", "nan"], "--controller-weight-decay: expected a finite"),
        (["--arch", "featuregate", "--gate-groups", "5"], "not divisible by gate_groups=5"),
    ],
)
def test_a_bad_design_option_is_one_line(flags, fragment, small_text, tmp_path):
    result = fca("train", *flags, "--train", small_text, "--window", "32", "--steps", "2", "--out", tmp_path / "o")
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "o" / "config.json").exists()


def test_hf_config_refuses_the_gate_flags(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    result = fca("train", "--hf-config", config, "--gate-input", "raw", "--out", tmp_path / "o")
    assert_one_line_error(result, "--gate-input shape --arch models")


def test_the_model_card_names_the_variant(small_text, tmp_path):
    train(two_steps(small_text, gate_range="sigmoid", controller_lr_mult=0.5), tmp_path / "run")
    readme = (tmp_path / "run" / "README.md").read_text()
    assert "--gate-range sigmoid --controller-lr-mult 0.5 --out DIR" in readme
    assert "gates = sigmoid(z)" in readme and "gates start at 0.5" in readme
    assert "learning rate 0.5 × the model's" in readme


def load_study():
    spec = importlib.util.spec_from_file_location("controller_design", ROOT / "studies" / "controller_design.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_plan_puts_every_variant_of_seed_0_first_and_every_variant_parses():
    study = load_study()
    runs = study.plan()
    assert len(runs) == 3 * len(study.VARIANTS)
    assert [r.seed for r in runs] == sorted(r.seed for r in runs)
    assert [r.variant for r in runs[: len(study.VARIANTS)]] == list(study.VARIANTS)
    parser = build_parser()
    for run in runs[: len(study.VARIANTS)]:
        args = parser.parse_args(run.train_args(Path("/w")))
        assert (args.steps, args.seed, args.arch) == (300, 0, "featuregate")


def test_the_study_trains_audits_summarises_and_resumes(small_text, tmp_path, monkeypatch):
    study = load_study()
    runner = sys.modules["design_runner"]  # the loop, status and listing both studies share, as the script imports it
    tiny = ("--layers", "2", "--width", "32", "--window", "32", "--batch-size", "8", "--train", small_text)
    runs = study.plan(
        seeds=(0,), variants=("default", "combo"), steps=2, train_extra=tiny, audit_extra=("--max-windows", "4")
    )
    work, out = tmp_path / "work", tmp_path / "out"
    assert runner.study(runs, work, out, study.run_one) == []
    for run in runs:
        assert sorted(p.name for p in (out / run.name).iterdir()) == [
            runner.SUMMARY_FILE,
            "model_card.json",
            "train_log.csv",
        ]
        summary = json.loads((out / run.name / runner.SUMMARY_FILE).read_text())
        audit = json.loads((work / f"{run.name}-audit" / "audit.json").read_text())
        assert summary["retention"] == audit["retention"] and summary["variance"] == audit["variance"]
        assert summary["conditions"]["cross_input"] == audit["conditions"]["cross_input"]
        assert summary["eval_nll"] == json.loads((out / run.name / "model_card.json").read_text())["eval_nll"]
        assert summary["commands"]["train"].startswith("fca train --arch featuregate --seed 0 --steps 2")
        assert not list((out / run.name).glob("*.safetensors"))
    assert json.loads((out / "combo-s0" / "model_card.json").read_text())["settings"]["gate_input"] == "detached"
    assert "2 of 2 runs done" in runner.listing(runs, work, out)

    (out / "combo-s0" / runner.SUMMARY_FILE).unlink()  # audited, not summarised: summarised without rerunning fca
    monkeypatch.setattr(study, "fca", lambda argv: pytest.fail(f"reran fca {argv}"))
    assert runner.status(runs[1], work, out) == "audited"
    assert runner.study(runs, work, out, study.run_one) == []
    assert json.loads((out / "combo-s0" / runner.SUMMARY_FILE).read_text())["audit_seconds"] is None


@pytest.mark.parametrize("field, value", [("gate_range", "3sigmoid"), ("gate_input", "normal")])
def test_a_checkpoint_with_an_unknown_design_is_refused_in_one_line(field, value, small_text, tmp_path):
    build_model(two_steps(small_text), load_tokenizer()).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(UserError, match=f"config.json: {field}='{value}': choose from"):
        load_model(tmp_path / "m")


# --------------------------------------------------------------------------------------------------------
# The study's results: its tables, notebook 09 and what a broken run folder gives
# --------------------------------------------------------------------------------------------------------

STUDY = ROOT / "data" / "controller_design"
FIGURE_PATHS = {  # column -> where an independent reader finds the figure in audit_summary.json
    "retention_layer_mean": ("retention", "layer_mean", "value"),
    "r2_layer": ("variance", "r2_layer"),
    "r2_layer_slot": ("variance", "r2_layer_slot"),
    "delta_cross_input": ("conditions", "cross_input", "delta"),
    "delta_token_shuffle": ("conditions", "token_shuffle", "delta"),
}
CI_PATHS = {
    "retention_layer_mean": ("retention", "layer_mean", "ci95"),
    "delta_cross_input": ("conditions", "cross_input", "delta_ci95"),
    "delta_token_shuffle": ("conditions", "token_shuffle", "delta_ci95"),
}


def dig(tree, keys):
    for key in keys:
        tree = tree[key]
    return tree


def committed_runs(folder=STUDY):
    """Every run folder holding both files, read with json, by folder name."""
    return {
        p.name: (json.loads((p / "audit_summary.json").read_text()), json.loads((p / "model_card.json").read_text()))
        for p in sorted(folder.iterdir())
        if (p / "audit_summary.json").is_file() and (p / "model_card.json").is_file()
    }


def other_seed(study, run, seed, shift):
    """A copy of ``run`` as seed ``seed``, every figure the tables show moved by ``shift``."""
    summary, card = (json.loads((study / run / name).read_text()) for name in ("audit_summary.json", "model_card.json"))
    variant = summary["variant"]
    summary["seed"], summary["run"], card["eval_nll"] = seed, f"{variant}-s{seed}", card["eval_nll"] + shift
    summary["eval_nll"] = card["eval_nll"]
    for keys in FIGURE_PATHS.values():
        dig(summary, keys[:-1])[keys[-1]] += shift
    folder = study / f"{variant}-s{seed}"
    folder.mkdir()
    (folder / "audit_summary.json").write_text(json.dumps(summary))
    (folder / "model_card.json").write_text(json.dumps(card))


@pytest.fixture
def mixed_study(tmp_path):
    """The committed seed-0 runs only, the default with seeds 1 and 2 besides (1 and 3 seeds per variant), and one
    run folder still being trained (its card, no summary)."""
    study = tmp_path / "study"
    shutil.copytree(STUDY, study)
    for later in study.glob("*-s[1-9]*"):  # the study's own later seeds, whatever has been committed so far
        shutil.rmtree(later)
    other_seed(study, "default-s0", 1, 0.01)
    other_seed(study, "default-s0", 2, -0.03)
    (study / "groups-1-s1").mkdir()
    shutil.copy(study / "groups-1-s0" / "model_card.json", study / "groups-1-s1")
    return study


def test_the_run_table_equals_the_committed_files():
    study = read_design_study()
    assert study.folder == STUDY and study.skipped == []
    committed = committed_runs()
    assert len(committed) >= 13
    table = design_runs_table(study.runs)
    assert sorted(f"{r.variant}-s{r.seed}" for r in table.itertuples()) == sorted(committed)
    assert table.variant.iloc[0] == "default"  # the reference comes first
    for row in table.to_dict("records"):
        summary, card = committed[f"{row['variant']}-s{row['seed']}"]
        assert row["eval_nll"] == card["eval_nll"] and row["params"] == card["params"]
        for key, keys in FIGURE_PATHS.items():
            assert row[key] == dig(summary, keys), key
        for key, keys in CI_PATHS.items():
            assert [row[f"{key}_ci95_lo"], row[f"{key}_ci95_hi"]] == dig(summary, keys), key
    axes = dict(zip(table.variant, zip(table.axis, table.setting)))
    assert axes["range-1tanh"] == ("gate range", "1+tanh")  # the card's setting, not the folder name's
    assert axes["groups-96"] == ("gate groups", "96") and axes["clr-0.1"] == ("controller lr multiplier", "0.1")
    assert axes["wide-256x6"] == ("width × depth", "256x6") and axes["default"] == ("default", "default")


def test_the_seed_table_and_the_plotted_points_equal_an_independent_aggregate(mixed_study):
    study = read_design_study(mixed_study)
    [skipped] = study.skipped
    assert skipped.startswith("groups-1-s1: no audit_summary.json") and "\n" not in skipped
    committed = committed_runs(mixed_study)
    seeds = {r["variant"]: r for r in design_seed_table(study.runs).to_dict("records")}
    points = {(p["variant"], p["figure"]): p for p in design_points(study.runs).to_dict("records")}
    assert (seeds["default"]["n"], seeds["default"]["seeds"]) == (3, "0, 1, 2")
    assert (seeds["groups-1"]["n"], seeds["groups-1"]["seeds"]) == (1, "0")  # its unfinished seed 1 left out
    for variant, row in seeds.items():
        runs = [v for k, v in committed.items() if k.rsplit("-s", 1)[0] == variant]
        assert len(runs) == row["n"]
        for key, keys in {"eval_nll": None, **FIGURE_PATHS}.items():
            values = [card["eval_nll"] if keys is None else dig(summary, keys) for summary, card in runs]
            mean = statistics.fmean(values)
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            assert row[f"{key}_mean"] == pytest.approx(mean, rel=1e-12, abs=1e-15), (variant, key)
            assert row[f"{key}_sd"] == pytest.approx(sd, rel=1e-9, abs=1e-15) and row[f"{key}_n"] == len(values)
            point = points[variant, key]
            assert point["value"] == row[f"{key}_mean"] and point["label"].endswith(f"(n={len(values)})")
            if len(values) > 1:  # several seeds: ± their sd
                assert point["error_minus"] == pytest.approx(sd) and point["error_plus"] == pytest.approx(sd)
            elif key in CI_PATHS:  # one seed: the audit's 95% CI
                lo, hi = dig(runs[0][0], CI_PATHS[key])
                assert point["error_minus"] == pytest.approx(mean - lo) and point["error_plus"] == pytest.approx(
                    hi - mean
                )
            else:
                assert point["error_minus"] == point["error_plus"] == 0.0 and point["error"] == "one seed, no CI"
    assert seeds["default"]["delta_cross_input_sd"] > 0.02  # the shifted copies really are other numbers


def broken_card(run):
    (run / "model_card.json").unlink()


def invalid_json(run):
    (run / "audit_summary.json").write_text('{"variant": "cwd-0", ')


def no_cross_input(run):
    summary = json.loads((run / "audit_summary.json").read_text())
    del summary["conditions"]["cross_input"]
    (run / "audit_summary.json").write_text(json.dumps(summary))


def three_bounds(run):
    summary = json.loads((run / "audit_summary.json").read_text())
    summary["retention"]["layer_mean"]["ci95"] = [0.1, 0.2, 0.3]
    (run / "audit_summary.json").write_text(json.dumps(summary))


def another_runs_summary(run):
    shutil.copy(run.parent / "default-s0" / "audit_summary.json", run / "audit_summary.json")


def another_eval_nll(run):
    card = json.loads((run / "model_card.json").read_text())
    (run / "model_card.json").write_text(json.dumps({**card, "eval_nll": card["eval_nll"] + 0.5}))


def a_link_outside(run):
    outside = run.parent.parent / "elsewhere.json"
    (run / "audit_summary.json").rename(outside)
    (run / "audit_summary.json").symlink_to(outside)


@pytest.mark.parametrize(
    "break_it, fragment",
    [
        (broken_card, "cwd-0-s0: no model_card.json (an unfinished run?)"),
        (invalid_json, "audit_summary.json is not valid JSON"),
        (no_cross_input, "is not a study audit_summary.json: conditions: 'cross_input' is a required property"),
        (three_bounds, "retention.layer_mean.ci95: [0.1, 0.2, 0.3] is too long"),
        (another_runs_summary, "cwd-0-s0: its audit_summary.json is the run default-s0, not cwd-0-s0"),
        (another_eval_nll, "cwd-0-s0: its audit_summary.json has eval_nll 5.0346, its model_card.json 5.5346"),
        (a_link_outside, "points outside the folder"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_broken_run_folder_is_left_out_with_one_line(break_it, fragment, tmp_path):
    study = Path(shutil.copytree(STUDY, tmp_path / "study"))
    break_it(study / "cwd-0-s0")
    read = read_design_study(study)
    [line] = read.skipped
    assert line.startswith("cwd-0-s0: ") and fragment in line and "\n" not in line, line
    assert "cwd-0-s0" not in {r["run"] for r in read.runs} and len(read.runs) == len(committed_runs()) - 1
    assert len(design_seed_table(read.runs)) == len({r["variant"] for r in read.runs})  # the rest still build


def test_a_study_folder_without_runs_is_one_line_before_any_notebook_runs(tmp_path):
    with pytest.raises(UserError, match="study folder not found: .*gone"):
        read_design_study(tmp_path / "gone")
    (tmp_path / "empty" / "default-s0").mkdir(parents=True)
    with pytest.raises(UserError, match=r"no run of the controller-design study in .*empty.*1 skipped, the first "):
        read_design_study(tmp_path / "empty")
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"notebooks": ["09_controller_design"], "parameters": {"study": str(tmp_path / "gone")}})
    )
    result = fca("reproduce", "--config", config, "--out", tmp_path / "out")
    assert_one_line_error(result, "study folder not found")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(600)  # one notebook through papermill: a hung kernel fails here
def test_notebook_09_reads_whatever_seeds_there_are_and_its_tables_equal_the_files(mixed_study, tmp_path):
    plan = reproduce.plan(
        {"notebooks": ["09_controller_design"], "parameters": {"study": str(mixed_study)}}, tmp_path / "out"
    )
    [result] = reproduce.execute(plan, progress=False)
    assert result.ok, result.error
    committed = committed_runs(mixed_study)
    frame = pd.read_csv(plan.out / "tables" / "controller_design_runs.csv")
    assert sorted(f"{v}-s{s}" for v, s in zip(frame.variant, frame.seed)) == sorted(committed)
    for row in frame.to_dict("records"):
        summary, _ = committed[f"{row['variant']}-s{row['seed']}"]
        assert row["delta_cross_input"] == dig(summary, FIGURE_PATHS["delta_cross_input"])
    over = pd.read_csv(plan.out / "tables" / "controller_design_over_seeds.csv").set_index("variant")
    assert over.loc["default", "n"] == 3 and over.loc["combo", "n"] == 1
    figures = {p.stem for p in (plan.out / "figures").glob("*.html")}
    assert {f"controller_design_{n}" for n in ("retention", "r2_layer", "cross_input", "eval_nll")} <= figures
    executed = (plan.out / "notebooks" / "09_controller_design.ipynb").read_text()
    assert "left out: groups-1-s1: no audit_summary.json" in executed  # the unfinished run, named
    assert "`default` 3 (0, 1, 2)" in executed and "(n=3)" in executed and "(n=1)" in executed


def test_the_findings_table_quotes_the_committed_figures():
    """``controller_design.py --table`` (what docs/controller-design.md quotes): one row per variant, its seeds,
    and the default's retention and cross-input ΔNLL as the mean of the committed summaries."""
    lines = [line for line in load_study().findings_table(STUDY).splitlines() if line.startswith("| ")]
    header, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    rows = [dict(zip(header, row, strict=True)) for row in rows]
    committed = committed_runs()
    variants = [row["variant"] for row in rows]
    assert sorted(variants) == sorted({run.rsplit("-s", 1)[0] for run in committed})
    default = next(row for row in rows if row["variant"] == "default")
    runs = [summary for run, (summary, _) in committed.items() if run.rsplit("-s", 1)[0] == "default"]
    assert default["seed numbers"] == ", ".join(sorted(str(s["seed"]) for s in runs))
    assert default["seeds"] == str(len(runs))
    retention = statistics.fmean(s["retention"]["layer_mean"]["value"] for s in runs)
    assert default["retention layer_mean"].split(" ± ")[0] == f"{retention:.2%}"
    cross = statistics.fmean(s["conditions"]["cross_input"]["delta"] for s in runs)
    assert default["ΔNLL cross_input"].split(" ± ")[0] == f"{cross:+.4f}"


def test_the_docs_quote_the_table_of_the_committed_summaries():
    """docs/controller-design.md includes data/controller_design/findings.md: it is exactly what ``--table``
    prints from the committed summaries (regenerate it when a run is added)."""
    assert (STUDY / "findings.md").read_text() == load_study().findings_table(STUDY) + "\n"
    assert '--8<-- "data/controller_design/findings.md"' in (ROOT / "docs" / "controller-design.md").read_text()
