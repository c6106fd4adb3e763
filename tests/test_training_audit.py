"""FCA while a model trains: ``fca train --audit-every``, its resumable ``audit_log.csv``, and ``FCACallback``."""

import csv

import pytest
import torch
from test_train import small_text, tiny_settings  # noqa: F401 (small_text is a fixture)

from fca_workbench import tables
from fca_workbench.cli import main
from fca_workbench.interventions import derangement
from fca_workbench.models import FeatureGateForCausalLM, load_model, next_token_nll
from fca_workbench.tokenizer import load_tokenizer
from fca_workbench.train import build_model, train
from fca_workbench.training_audit import MiniAudit, figure_names, load_training_runs

AUDIT = dict(audit_every=3, audit_windows=4, steps=7, save_every=10)


def audit_rows(folder) -> list[dict]:
    with (folder / "audit_log.csv").open() as handle:
        return list(csv.DictReader(handle))


def figures_of(row: dict) -> dict[str, float]:
    return {name: float(row[name]) for name in figure_names()}


def mini_audit(tokenizer, window: int = 32) -> MiniAudit:
    return MiniAudit.from_splits(tokenizer, window, AUDIT["audit_windows"], seed=0, batch_size=8)


@torch.no_grad()
def direct_figures(model, windows: torch.Tensor) -> tuple[float, float]:
    """Eval NLL and cross-input ΔNLL computed here from the model alone, without capture or replay."""
    out = model.eval()(windows, return_coefficients=True)
    donors = derangement(len(windows), 0)
    crossed = model(windows, coefficients=[c[donors] for c in out.coefficients])
    nll, crossed_nll = next_token_nll(out.logits, windows).double(), next_token_nll(crossed.logits, windows).double()
    return nll.mean().item(), (crossed_nll.mean() - nll.mean()).item()


@pytest.fixture(scope="module")
def whole_run(small_text, tmp_path_factory):  # noqa: F811
    """One uninterrupted tiny run with mini-audits, shared by the tests that read it (none writes into it):
    its settings, folder and model card."""
    settings = tiny_settings("featuregate", small_text, **AUDIT)
    folder = tmp_path_factory.mktemp("training_audit") / "run"
    return settings, folder, train(settings, folder)


def test_audit_log_rows_equal_a_standalone_mini_audit_of_the_weights(whole_run, tmp_path):
    settings, run, card = whole_run
    rows = audit_rows(run)
    assert [int(r["step"]) for r in rows] == [3, 6, 7]  # every 3 steps, and the last one
    tokenizer = load_tokenizer()
    audit = mini_audit(tokenizer)
    final = load_model(run)
    assert figures_of(rows[-1]) == audit(final)
    nll, cross = direct_figures(final, audit.eval_windows)
    assert figures_of(rows[-1])["nll_correct"] == pytest.approx(nll, abs=1e-5)
    assert figures_of(rows[-1])["delta_cross_input"] == pytest.approx(cross, abs=1e-5)
    assert figures_of(rows[-1])["delta_cross_input"] != figures_of(rows[0])["delta_cross_input"]

    train(settings, tmp_path / "at3", stop_after=3)  # the weights of step 3, from the resumable state
    state = torch.load(tmp_path / "at3" / "trainer_state.pt", weights_only=False)
    at3 = build_model(settings, tokenizer)
    at3.load_state_dict(state["model"])
    assert figures_of(rows[0]) == audit(at3)
    assert card["audit"]["audits"] == 3
    assert card["audit"]["audit_seconds"] == pytest.approx(sum(float(r["audit_seconds"]) for r in rows), abs=0.1)
    assert "mini-audits" in (run / "README.md").read_text()
    table = tables.training_dynamics_table(load_training_runs([run]))  # what notebook 07 shows
    assert table.step.tolist() == [3, 6, 7]
    for column, logged in (("delta_cross_input", "delta_cross_input"), ("delta_cross_input_ci95_lo", "delta_cross_input_lo"),
                           ("retention_layer_mean_ci95_hi", "retention_layer_mean_hi"), ("r2_layer_slot", "r2_layer_slot")):
        assert table[column].tolist() == [float(r[logged]) for r in rows]


def test_resumed_run_continues_the_audit_log_without_duplicate_rows(whole_run, tmp_path):
    settings, whole_folder, _ = whole_run
    assert train(settings, tmp_path / "split", stop_after=4) is None
    assert [r["step"] for r in audit_rows(tmp_path / "split")] == ["3"]
    # An audit whose training state was never saved (the run died after it): the resumed run must redo it.
    log = tmp_path / "split" / "audit_log.csv"
    log.write_text(log.read_text() + log.read_text().splitlines()[-1].replace("3,", "6,", 1) + "\n")
    train(settings, tmp_path / "split")
    whole, split = audit_rows(whole_folder), audit_rows(tmp_path / "split")
    assert [r["step"] for r in split] == ["3", "6", "7"]
    assert [figures_of(r) for r in split] == [figures_of(r) for r in whole]


def test_trainer_callback_logs_the_mini_audit_through_the_trainer(tmp_path):
    from transformers import Trainer, TrainingArguments

    from fca_workbench.callbacks import FCACallback

    tokenizer = load_tokenizer()
    settings = tiny_settings("featuregate", None)
    model = build_model(settings, tokenizer)
    audit = mini_audit(tokenizer)
    data = [{"input_ids": w, "labels": w} for w in audit.calib_windows.repeat(4, 1)]
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-2, report_to="none", save_strategy="no", logging_steps=100,
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(FCACallback(trainer, audit, every=2))
    reported = []

    class Reporter(FCACallback.__mro__[1]):  # a stand-in for TensorBoard/MLflow: receives on_log like them
        def on_log(self, args, state, control, logs=None, **kwargs):
            reported.append(dict(logs))

    trainer.add_callback(Reporter())
    trainer.train()
    logged = [e for e in trainer.state.log_history if "fca/nll_correct" in e]
    assert [e["step"] for e in logged] == [2, 4]
    assert sum("fca/retention_layer_mean" in r for r in reported) == 2
    trainer.save_model(tmp_path / "final")
    standalone = audit(FeatureGateForCausalLM.from_pretrained(tmp_path / "final"))
    assert {k.removeprefix("fca/"): v for k, v in logged[-1].items() if k.startswith("fca/")} == standalone
    assert logged[0]["fca/nll_correct"] != logged[1]["fca/nll_correct"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--arch", "dense", "--audit-every", "2"], "--audit-every needs a model with a controller; dense has none"),
        (["--arch", "featuregate", "--audit-every", "9"], "--audit-every 9 must be between 1 and the run's 8 steps"),
        (["--arch", "featuregate", "--audit-every", "2", "--audit-windows", "100000"], "fewer than --audit-windows 100000"),
        (["--arch", "featuregate", "--audit-every", "2", "--audit-windows", "1"], "--audit-windows must be at least 2"),
    ],
)
def test_bad_audit_settings_are_refused_in_one_line_before_training(flags, message, small_text, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    code = main(["train", *flags, "--train", small_text, "--steps", "8", "--window", "32", "--layers", "1",
                 "--width", "32", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fca: error: ") and message in err
    assert not out.exists()
