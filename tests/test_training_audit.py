"""FCA while a model trains: ``fca train --audit-every``, its resumable ``audit_log.csv``, and ``FCACallback``."""

import csv
import math

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from test_train import TINY_HF_CONFIGS, hf_settings, small_text, tiny_settings, write_config  # noqa: F401 (small_text is a fixture)
from transformers import AutoModelForCausalLM

from fca_workbench.audit.interventions import derangement
from fca_workbench.audit.mini import MiniAudit
from fca_workbench.cli import main
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.models import FeatureGateForCausalLM, load_model, next_token_nll
from fca_workbench.notebooks import tables
from fca_workbench.training.train import build_hf_model, build_model, train
from fca_workbench.training.training_audit import load_training_runs

ROUTER_KEYS = [c.key for c in tables.ROUTER_DYNAMICS_COLUMNS]

AUDIT = dict(audit_every=3, audit_windows=4, steps=7, save_every=10)


def audit_rows(folder) -> list[dict]:
    with (folder / "audit_log.csv").open() as handle:
        return list(csv.DictReader(handle))


def figures_of(row: dict) -> dict[str, float]:
    return {name: float(value) for name, value in row.items() if name not in ("step", "audit_seconds")}


def assert_same_figures(logged: dict[str, float], standalone: dict[str, float]) -> None:
    """Same names in the same order, values within 1e-6 (NaN, an undefined retention, equals NaN)."""
    assert list(logged) == list(standalone)
    assert all(
        math.isclose(logged[k], standalone[k], abs_tol=1e-6) or (math.isnan(logged[k]) and math.isnan(standalone[k]))
        for k in logged
    ), {k: (logged[k], standalone[k]) for k in logged if logged[k] != standalone[k]}


ROUTER_FIGURES = (
    "delta_layer_mean_topk",
    "delta_layer_mean_topk_lo",
    "delta_layer_mean_topk_hi",
    "retention_layer_mean_topk",
    "expert_fraction_executed",
)


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
def whole_run(small_text, tmp_path_factory):  # noqa: F811  (small_text: the fixture imported above)
    """One uninterrupted tiny run with mini-audits, shared by the tests that read it (none writes into it):
    its settings, folder and model card."""
    settings = tiny_settings("featuregate", small_text, **AUDIT)
    folder = tmp_path_factory.mktemp("training_audit") / "run"
    return settings, folder, train(settings, folder)


def test_the_readme_is_a_hub_model_card_with_the_eval_nll_and_the_last_mini_audit_as_eval_results(whole_run):
    _, run, card = whole_run
    hub_card = ModelCard.load(run / "README.md")
    results = {r.metric_type: r for r in hub_card.data.eval_results}
    last = figures_of(audit_rows(run)[-1])
    assert results["eval_nll"].metric_value == card["eval_nll"]
    assert results["mini_audit_nll_correct"].metric_value == last["nll_correct"]
    assert results["mini_audit_retention_layer_mean"].metric_value == last["retention_layer_mean"]
    assert not any(name.endswith(("_lo", "_hi")) for name in results)  # the intervals stay in audit_log.csv
    assert {r.dataset_split for r in results.values()} == {"eval"}
    assert "fca-trained" in hub_card.data.tags and hub_card.data.library_name == "transformers"
    assert f"| {card['eval_nll']} |" in hub_card.text  # the Markdown card below the front matter


def test_audit_log_rows_equal_a_standalone_mini_audit_of_the_weights(whole_run, tmp_path):
    settings, run, card = whole_run
    rows = audit_rows(run)
    assert [int(r["step"]) for r in rows] == [3, 6, 7]  # every 3 steps, and the last one
    tokenizer = load_tokenizer()
    audit = mini_audit(tokenizer)
    final = load_model(run)
    assert same_figures(figures_of(rows[-1]), audit(final))
    nll, cross = direct_figures(final, audit.eval_windows)
    assert figures_of(rows[-1])["nll_correct"] == pytest.approx(nll, abs=1e-5)
    assert figures_of(rows[-1])["delta_cross_input"] == pytest.approx(cross, abs=1e-5)
    assert figures_of(rows[-1])["delta_cross_input"] != figures_of(rows[0])["delta_cross_input"]

    train(settings, tmp_path / "at3", stop_after=3)  # the weights of step 3, from the resumable state
    state = torch.load(tmp_path / "at3" / "trainer_state.pt", weights_only=False)
    at3 = build_model(settings, tokenizer)
    at3.load_state_dict(state["model"])
    assert same_figures(figures_of(rows[0]), audit(at3))
    assert card["audit"]["audits"] == 3
    assert card["audit"]["audit_seconds"] == pytest.approx(sum(float(r["audit_seconds"]) for r in rows), abs=0.1)
    assert "mini-audits" in (run / "README.md").read_text()
    table = tables.training_dynamics_table(load_training_runs([run]))  # what notebook 07 shows
    assert table.step.tolist() == [3, 6, 7]
    assert not set(ROUTER_KEYS) & set(table.columns)  # no routers, no router columns
    for column, logged in (
        ("delta_cross_input", "delta_cross_input"),
        ("delta_cross_input_ci95_lo", "delta_cross_input_lo"),
        ("retention_layer_mean_ci95_hi", "retention_layer_mean_hi"),
        ("r2_layer_slot", "r2_layer_slot"),
    ):
        assert same_figures(dict(enumerate(table[column].tolist())), dict(enumerate(float(r[logged]) for r in rows)))


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
    assert len(split) == len(whole)
    assert all(same_figures(figures_of(a), figures_of(b)) for a, b in zip(split, whole))


@torch.no_grad()
def direct_static_topk(model, eval_windows: torch.Tensor, calib_windows: torch.Tensor) -> tuple[float, float]:
    """A Mixtral's eval NLL and the ΔNLL of its static sparse model, computed here without the workbench: each
    router's dense gate averaged over the calibration tokens, its k largest entries renormalised to sum to 1
    (Mixtral renormalises its top-k weights), returned for every token by the router's replaced forward."""
    model.eval()
    routers = [layer.mlp.gate for layer in model.model.layers]
    sums = [0.0] * len(routers)

    def recorder(index):
        def hook(module, args, output):
            logits, weights, experts = output
            sums[index] = sums[index] + torch.zeros_like(logits).scatter(-1, experts, weights).double().sum(dim=0)

        return hook

    handles = [router.register_forward_hook(recorder(i)) for i, router in enumerate(routers)]
    model(calib_windows)
    for handle in handles:
        handle.remove()

    def eval_nll() -> float:
        return next_token_nll(model(eval_windows).logits, eval_windows).double().mean(dim=1).mean().item()

    correct = eval_nll()
    k = model.config.num_experts_per_tok
    for router, total in zip(routers, sums):
        top = (total / calib_windows.numel()).float().topk(k)
        weights, experts = top.values / top.values.sum(), top.indices

        def static(hidden, weights=weights, experts=experts, width=router.weight.shape[0]):
            rows = hidden.reshape(-1, hidden.shape[-1]).shape[0]
            return torch.zeros(rows, width), weights.expand(rows, k), experts.expand(rows, k)

        router.forward = static
    try:
        return correct, eval_nll() - correct
    finally:
        for router in routers:
            del router.forward


def test_hf_config_audit_log_holds_the_routers_figures_and_equals_a_standalone_mini_audit(small_text, tmp_path):  # noqa: F811  (the fixture imported above)
    settings = hf_settings(tmp_path, "mixtral", small_text, steps=4, audit_every=2, audit_windows=4, save_every=10)
    train(settings, tmp_path / "run")
    rows = audit_rows(tmp_path / "run")
    assert [int(r["step"]) for r in rows] == [2, 4]
    assert set(ROUTER_FIGURES) <= rows[-1].keys()
    audit = mini_audit(load_tokenizer())
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert_same_figures(figures_of(rows[-1]), audit(final))
    assert not final.training and final.get_experts_implementation() == {"": "grouped_mm"}  # as the audit found it
    nll, static_delta = direct_static_topk(final, audit.eval_windows, audit.calib_windows)
    assert figures_of(rows[-1])["nll_correct"] == pytest.approx(nll, abs=1e-6)
    assert figures_of(rows[-1])["delta_layer_mean_topk"] == pytest.approx(static_delta, abs=1e-6)
    assert figures_of(rows[-1])["delta_layer_mean_topk"] != figures_of(rows[-1])["delta_layer_mean"]
    assert figures_of(rows[-1])["expert_fraction_executed"] == 2 / 4  # k of E experts per token
    table = tables.training_dynamics_table(load_training_runs([tmp_path / "run"]))  # what notebook 07 shows
    for key in ROUTER_KEYS:
        assert same_figures(dict(enumerate(table[key].tolist())), dict(enumerate(float(r[key]) for r in rows)))
    # The audits leave training as it was (train mode, the default experts implementation): the same weights.
    train(hf_settings(tmp_path, "mixtral", small_text, steps=4, save_every=10), tmp_path / "plain")
    audited, plain = (
        load_file(tmp_path / "run" / "model.safetensors"),
        load_file(tmp_path / "plain" / "model.safetensors"),
    )
    assert all(torch.equal(audited[k], plain[k]) for k in plain)


def train_with_callback(model, audit: MiniAudit, folder):
    """Four steps of a real ``transformers.Trainer`` with ``FCACallback(every=2)`` and a stand-in reporter (like
    TensorBoard or MLflow, it receives ``on_log``); returns the trainer and what the reporter received."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from fca_workbench.training.callbacks import FCACallback

    data = [{"input_ids": w, "labels": w} for w in audit.calib_windows.repeat(4, 1)]
    args = TrainingArguments(
        output_dir=str(folder),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        logging_steps=100,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(FCACallback(trainer, audit, every=2))
    reported = []

    class Reporter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            reported.append(dict(logs))

    trainer.add_callback(Reporter())
    trainer.train()
    trainer.save_model(folder / "final")
    return trainer, reported


def logged_audits(trainer) -> list[dict]:
    """The Trainer's log entries that hold a mini-audit, as ``{figure: value}`` with the ``fca/`` prefix removed."""
    return [
        {k.removeprefix("fca/"): v for k, v in e.items() if k.startswith("fca/")} | {"step": e["step"]}
        for e in trainer.state.log_history
        if "fca/nll_correct" in e
    ]


def test_trainer_callback_logs_the_mini_audit_through_the_trainer(tmp_path):
    tokenizer = load_tokenizer()
    audit = mini_audit(tokenizer)
    trainer, reported = train_with_callback(build_model(tiny_settings("featuregate", None), tokenizer), audit, tmp_path)
    logged = logged_audits(trainer)
    assert [e.pop("step") for e in logged] == [2, 4]
    assert sum("fca/retention_layer_mean" in r for r in reported) == 2
    assert logged[-1] == audit(FeatureGateForCausalLM.from_pretrained(tmp_path / "final"))
    assert logged[0]["nll_correct"] != logged[1]["nll_correct"]


def test_trainer_callback_on_a_transformers_moe_logs_the_routers_figures(tmp_path):
    tokenizer = load_tokenizer()
    audit = mini_audit(tokenizer)
    torch.manual_seed(0)
    model = build_hf_model({"model_type": "mixtral", **TINY_HF_CONFIGS["mixtral"]}, tokenizer, 32)
    trainer, reported = train_with_callback(model, audit, tmp_path)
    logged = logged_audits(trainer)
    assert [e.pop("step") for e in logged] == [2, 4]
    assert sum(f"fca/{name}" in r for r in reported for name in ROUTER_FIGURES) == 2 * len(ROUTER_FIGURES)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert_same_figures(logged[-1], audit(final))
    nll, static_delta = direct_static_topk(final, audit.eval_windows, audit.calib_windows)
    assert logged[-1]["nll_correct"] == pytest.approx(nll, abs=1e-6)
    assert logged[-1]["delta_layer_mean_topk"] == pytest.approx(static_delta, abs=1e-6)
    assert logged[0]["delta_layer_mean_topk"] != logged[1]["delta_layer_mean_topk"]


SHAPE = ["--layers", "1", "--width", "32"]
LLAMA = "LLAMA_CONFIG"  # replaced by the path of a tiny llama config: a transformers model without a controller


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--arch", "dense", *SHAPE, "--audit-every", "2"],
            "--audit-every needs a model with a controller; dense has none",
        ),
        (["--hf-config", LLAMA, "--audit-every", "2"], "--audit-every needs a model with a controller; llama has none"),
        (
            ["--arch", "featuregate", *SHAPE, "--audit-every", "9"],
            "--audit-every 9 must be between 1 and the run's 8 steps",
        ),
        (
            ["--arch", "featuregate", *SHAPE, "--audit-every", "2", "--audit-windows", "100000"],
            "fewer than --audit-windows 100000",
        ),
        (
            ["--arch", "featuregate", *SHAPE, "--audit-every", "2", "--audit-windows", "1"],
            "--audit-windows must be at least 2",
        ),
    ],
)
def test_bad_audit_settings_are_refused_in_one_line_before_training(flags, message, small_text, tmp_path, capsys):  # noqa: F811  (the fixture imported above)
    moe_only = ("num_local_experts", "num_experts_per_tok")
    llama = write_config(
        tmp_path, model_type="llama", **{k: v for k, v in TINY_HF_CONFIGS["mixtral"].items() if k not in moe_only}
    )
    out = tmp_path / "run"
    flags = [str(llama) if flag == LLAMA else flag for flag in flags]
    code = main(["train", *flags, "--train", small_text, "--steps", "8", "--window", "32", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fca: error: ") and message in err
    assert not out.exists()


def same_figures(a: dict, b: dict) -> bool:
    """Equal figure by figure, NaN (an unresolved retention, an empty cell) equal to NaN."""
    return a.keys() == b.keys() and all(x == y or (x != x and y != y) for x, y in ((a[k], b[k]) for k in a))
