"""``fca eval``: lm-eval tasks under static FCA conditions, checked against accuracies computed here from the
model's own forward (not through lm-eval), end to end on a native and a foreign checkpoint, offline."""

import json
import math
import socket
import sys
from pathlib import Path

import pytest
import torch
from conftest import fca
from test_hub import COMMIT, cache_snapshot, offline_cache  # noqa: F401 (offline_cache: a fixture used here)

from fca_workbench.cli import main
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tasks import (
    CHOICES,
    NEXT_LINE,
    NEXT_LINE_FILE,
    NEXT_WORD,
    PLAY_CHOICE_FILE,
    PLAY_CHOICE_TASK,
    TASKS_DIR,
    WORD_LENGTH_SLACK,
    next_line_items,
    play_choice_items,
    task_jsonl,
)
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows, read_documents
from fca_workbench.downstream.evaluation import task_figures
from fca_workbench.downstream.table import downstream_table
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.notebooks import reproduce
from fca_workbench.results import load_audit
from fca_workbench.results.frames import DOWNSTREAM_COLUMNS
from fca_workbench.results.layout import DOWNSTREAM_FILE
from fca_workbench.viewmodel.downstream import downstream_tables
from fca_workbench.viewmodel.results_folder import ResultsFolder

pytest.importorskip("lm_eval")
datasets = pytest.importorskip("datasets")  # lm-eval's

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = "data/checkpoints/featuregate-s0"
LIMIT, WINDOW, CALIBRATION_WINDOWS = 12, 128, 4


def test_the_shipped_task_rebuilds_byte_for_byte():
    assert task_jsonl() == (TASKS_DIR / NEXT_LINE_FILE).read_bytes()
    items = next_line_items(read_documents(split_path("eval")))
    assert len(items) == 200 and {item["play"] for item in items} == {0, 1, 2, 3}
    for item in items:
        true = item["choices"][item["label"]]
        assert len(set(item["choices"])) == 4 and item["context"].endswith("\n")
        assert all(sorted(c.split(" ")) == sorted(true.split(" ")) for c in item["choices"])  # the same words
        assert true in read_documents(split_path("eval"))[item["play"]]


def test_the_larger_task_rebuilds_byte_for_byte_with_two_kinds_of_item():
    """``fca_play_choice``: 1,600 items from the eval split, half next-line, half next-word; each next-word item's
    true word is the one that follows its context in the play, the others plain words of about its length."""
    assert task_jsonl(PLAY_CHOICE_TASK) == (TASKS_DIR / PLAY_CHOICE_FILE).read_bytes()
    plays = read_documents(split_path("eval"))
    items = play_choice_items(plays)
    assert len(items) == 1600 and {(item["kind"], item["play"]) for item in items} == {
        (kind, play) for kind in (NEXT_LINE, NEXT_WORD) for play in range(4)
    }
    assert items != play_choice_items(plays, seed=1)  # the seed decides the draw
    for item in items:
        assert len(set(item["choices"])) == CHOICES and 0 <= item["label"] < CHOICES
        true = item["choices"][item["label"]]
        if item["kind"] == NEXT_WORD:
            lines = [line.strip() for line in plays[item["play"]].splitlines() if line.strip()]
            said = "\n".join(lines) + "\n"
            assert (item["context"] + true + " ") in said or (item["context"] + true + "\n") in said
            words = [choice[1:] for choice in item["choices"]]
            assert all(c.startswith(" ") and w.isalpha() and w.islower() for c, w in zip(item["choices"], words))
            assert all(abs(len(w) - len(true[1:])) <= WORD_LENGTH_SLACK for w in words)
        else:
            assert sorted(true.split(" ")) == sorted(item["choices"][item["label"] - 1].split(" "))


def test_lm_eval_loads_every_shipped_task_from_its_own_folder(tmp_path, monkeypatch):
    """lm-eval's task manager, the shipped folder included, reads each task's documents from beside its YAML
    whatever the working directory (``data/tasks/local_files.py``)."""
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)
    loaded = TaskManager(include_path=str(TASKS_DIR), include_defaults=False).load(["fca_next_line", PLAY_CHOICE_TASK])
    sizes = {name: len(list(task.test_docs())) for name, task in loaded["tasks"].items()}
    assert sizes == {"fca_next_line": 200, PLAY_CHOICE_TASK: 1600}


@pytest.fixture(scope="module")
def no_network(monkeypatch_module):
    """Any connection attempt fails the test: the shipped task must run offline."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"fca eval tried to reach the network: {args}")

    monkeypatch_module.setattr(socket.socket, "connect", refuse)
    monkeypatch_module.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def shipped_eval(tmp_path_factory, no_network):
    """``fca eval`` of the shipped FeatureGate on the shipped task, in this process with the network refused."""
    out = tmp_path_factory.mktemp("eval") / "audit-featuregate-s0"
    argv = ["eval", SHIPPED, "--tasks", "fca_next_line", "--conditions", "layer_mean,correct", "--limit", str(LIMIT)]
    argv += ["--window", str(WINDOW), "--max-windows", str(CALIBRATION_WINDOWS), "--out", str(out)]
    assert main(argv) == 0
    return json.loads((out / DOWNSTREAM_FILE).read_text()), out


def hand_accuracies() -> dict[str, list[bool]]:
    """Per condition, whether each of the first ``LIMIT`` items is answered right: the continuation's summed
    log-probability from the model's forward with ``coefficients=`` (the profile, broadcast by hand), the
    profile the mean of the calibration windows' coefficients computed here."""
    model, tokenizer = load_model(SHIPPED).eval(), load_tokenizer(SHIPPED)
    windows = load_windows(split_path("calibration"), tokenizer, WINDOW, CALIBRATION_WINDOWS)
    with torch.no_grad():
        captured = model(windows, return_coefficients=True).coefficients
    everything = torch.cat([c.double().flatten() for c in captured])
    profiles = {
        "correct": None,
        "global_mean": [torch.full(c.shape[2:], everything.mean().item()) for c in captured],
        "layer_mean": [c.double().mean(dim=(0, 1)).float() for c in captured],
    }
    items = [json.loads(line) for line in (TASKS_DIR / NEXT_LINE_FILE).read_text().splitlines()[:LIMIT]]
    right: dict[str, list[bool]] = {name: [] for name in profiles}
    for item in items:
        context = item["context"].rstrip("\n")  # lm-eval moves the context's trailing newline into the answer
        scores: dict[str, list[float]] = {name: [] for name in profiles}
        for choice in item["choices"]:
            start, ids = len(tokenizer.encode(context)), torch.tensor([tokenizer.encode(context + "\n" + choice)])
            assert ids.shape[1] <= WINDOW  # nothing cut by lm-eval
            for name, profile in profiles.items():
                coefficients = None if profile is None else [p.expand(1, ids.shape[1], *p.shape) for p in profile]
                with torch.no_grad():
                    logits = model(ids, coefficients=coefficients).logits[0, :-1].double()
                logprobs = logits.log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
                scores[name].append(logprobs[start - 1 :].sum().item())
        for name, score in scores.items():
            right[name].append(max(range(len(score)), key=score.__getitem__) == item["label"])
    return right


def test_eval_equals_the_accuracy_computed_from_the_models_forward(shipped_eval):
    downstream, _ = shipped_eval
    task = downstream["tasks"]["fca_next_line"]
    assert task["samples"] == LIMIT and list(task["conditions"]) == ["correct", "global_mean", "layer_mean"]
    right = hand_accuracies()
    accuracy = {name: sum(r) / LIMIT for name, r in right.items()}
    for name in right:
        figure = task["conditions"][name]["acc"]
        assert figure["value"] == pytest.approx(accuracy[name], abs=1e-12)
        p = accuracy[name]
        assert figure["stderr"] == pytest.approx(math.sqrt(p * (1 - p) / (LIMIT - 1)), abs=1e-12)  # sample sd / √n
    gap = accuracy["correct"] - accuracy["global_mean"]
    differences = [float(c) - float(g) for c, g in zip(right["correct"], right["global_mean"], strict=True)]
    mean = sum(differences) / LIMIT
    assert mean == pytest.approx(gap)
    # the first 12 items are all of one play: one cluster, so no clustered error and no retention
    assert task["clusters"] == {"field": "play", "count": 1}
    for name in ("global_mean", "layer_mean"):
        g = task["conditions"][name]["acc"]["gap"]
        assert g["value"] == pytest.approx(accuracy["correct"] - accuracy[name]) and g["paired"]
        assert g["clusters"] == 1 and g["stderr"] is None and g["ci95"] == [None, None]
    assert task["conditions"]["correct"]["acc"]["gap"] is None
    kept = task["conditions"]["layer_mean"]["acc"]["retention"]
    assert kept["resolved"] is False and kept["value"] is None and kept["reference"] == "global_mean"
    assert kept["numerator"]["value"] == pytest.approx(accuracy["layer_mean"] - accuracy["global_mean"])
    assert downstream["settings"]["limit"] == LIMIT and downstream["settings"]["lm_eval"] == "0.4.13"
    assert downstream["calibration"]["windows"] == CALIBRATION_WINDOWS


def test_load_audit_reads_downstream_beside_audit_json(shipped_eval):
    downstream, out = shipped_eval
    assert fca("audit", SHIPPED, "--out", out, "--max-windows", 2, "--window", WINDOW, "--resamples", 5,
               "--latency-repeats", 1).returncode == 0  # fmt: skip
    frame = load_audit(out).downstream
    assert list(frame.columns) == ["task", "condition", "metric", *DOWNSTREAM_COLUMNS, "reference"]
    figures = downstream["tasks"]["fca_next_line"]["conditions"]
    assert frame.set_index(["condition"])["value"].to_dict() == {c: f["acc"]["value"] for c, f in figures.items()}
    audit = json.loads((out / "audit.json").read_text())
    table = downstream_tables(out, audit)[0]
    assert table[["condition", "value"]].values.tolist() == [[c, f["acc"]["value"]] for c, f in figures.items()]
    outside = out.parent / "elsewhere.json"
    (out / DOWNSTREAM_FILE).rename(outside)
    assert load_audit(out).downstream.empty and downstream_tables(out, audit) == []
    (out / DOWNSTREAM_FILE).symlink_to(outside)  # the results view reads nothing outside the folder
    with pytest.raises(UserError, match="outside|inside|resolve"):
        downstream_tables(out, audit)
    (out / DOWNSTREAM_FILE).unlink()
    outside.rename(out / DOWNSTREAM_FILE)


def test_the_results_view_shows_a_downstream_json_that_came_after_it_drew_the_audit(shipped_eval, tmp_path):
    """The view keeps what it rendered of an audit folder; ``fca eval`` finishing later changes the folder."""
    sys.path.insert(0, str(ROOT / "dashboards"))
    import results_view

    downstream, out = shipped_eval
    folder = tmp_path / "results" / "featuregate-s0"
    assert fca("audit", SHIPPED, "--out", folder, "--max-windows", 2, "--window", WINDOW, "--resamples", 5,
               "--latency-repeats", 1).returncode == 0  # fmt: skip
    results = ResultsFolder(tmp_path / "results")

    def names() -> list[str]:
        (entry,) = results.scan()
        return [name for name, *_ in results_view.rendered(entry, results.full(entry))[0]]

    assert "downstream" not in names()
    (folder / DOWNSTREAM_FILE).write_bytes((out / DOWNSTREAM_FILE).read_bytes())
    assert "downstream" in names()


@pytest.mark.parametrize("which", ["native", "foreign"])
def test_fca_eval_end_to_end(which, tiny_checkpoints, tiny_mixtral, tmp_path):
    checkpoint = tiny_checkpoints["featuregate"] if which == "native" else tiny_mixtral
    conditions = "layer_position_mean,layer_scalar" if which == "native" else "layer_mean_topk,layer_mean"
    result = fca("eval", checkpoint, "--tasks", "fca_next_line", "--conditions", conditions, "--limit", 4,
                 "--max-windows", 2, "--out", tmp_path / "out")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "fca_next_line (4 documents, 1 cluster by play)" in result.stdout  # the first 4 items: one play
    downstream = json.loads((tmp_path / "out" / DOWNSTREAM_FILE).read_text())
    figures = downstream["tasks"]["fca_next_line"]["conditions"]
    references = ["random_topk"] if which == "foreign" else []  # the top-k profile's retention reference runs too
    assert list(figures) == ["correct", "global_mean", *conditions.split(","), *references]
    assert all(0 <= f["acc"]["value"] <= 1 for f in figures.values())
    assert downstream["model"]["arch"] == ("featuregate" if which == "native" else "mixtral")


def test_fca_eval_of_a_hub_name_records_its_id_and_commit(offline_cache, tiny_checkpoints, tmp_path, monkeypatch):  # noqa: F811  (the fixture imported above)
    snapshot = cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    monkeypatch.chdir(tmp_path)  # where no folder lab/fg is: the name is the hub's
    argv = ["eval", "lab/fg@main", "--tasks", "fca_next_line", "--limit", "2", "--max-windows", "2", "--out", "out"]
    assert main(argv) == 0
    downstream = json.loads((tmp_path / "out" / DOWNSTREAM_FILE).read_text())
    assert downstream["model"]["hub"] == {"id": "lab/fg", "revision": "main", "commit": COMMIT}
    assert downstream["model"]["path"] == str(snapshot)
    assert set(downstream_table([downstream])["model"]) == {"lab--fg@main"}


def run_error(argv, capsys) -> str:
    """``fca ARGV`` in this process: exit 2 and the one line it printed."""
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("fca: error:"), lines
    return lines[0]


def test_bad_input_is_one_line(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    native = str(tiny_checkpoints["featuregate"])
    assert "unknown task 'no_such_task'" in run_error(["eval", native, "--tasks", "no_such_task"], capsys)
    line = run_error(["eval", native, "--tasks", "hellaswag", "--out", str(tmp_path / "hub")], capsys)  # not on disk
    assert "lm-eval cannot load the tasks" in line and "HF_DATASETS_OFFLINE=0" in line
    assert not (tmp_path / "hub").exists()  # refused before the model loads or anything is written
    line = run_error(["eval", native, "--tasks", "fca_next_line", "--conditions", "cross_input"], capsys)
    assert "'cross_input' needs a text's own cached values" in line
    line = run_error(["eval", native, "--tasks", "fca_next_line", "--conditions", "bogus"], capsys)
    assert "'bogus' is not a condition" in line
    out = str(tmp_path / "out")
    line = run_error(["eval", native, "--tasks", "fca_next_line", "--conditions", "layer_mean_topk", "--out", out,
                      "--max-windows", "2"], capsys)  # fmt: skip
    assert "only for models whose controllers are top-k routers" in line
    dense = str(tiny_checkpoints["dense"])
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "fresh-datasets-cache")  # tasks built anew
    assert "only --conditions correct" in run_error(["eval", dense, "--tasks", "fca_next_line", "--out", out], capsys)
    assert (tmp_path / "fresh-datasets-cache").is_dir()  # the task's split was generated, its bar kept quiet
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    assert "pip install 'fca-workbench[eval]'" in run_error(["eval", native, "--tasks", "fca_next_line"], capsys)


def session_of(model, profiles=None):
    """A replay session on ``model`` alone, with ``profiles`` given instead of estimated."""
    from fca_workbench.audit.session import ReplaySession

    session = ReplaySession(model, {}, cache_root=None)
    if profiles is not None:
        session.use_profiles(profiles)
    return session


def test_correct_scores_what_lm_evals_own_hf_model_scores(tiny_mixtral):
    """``correct`` is the live model: on a foreign checkpoint, ``WorkbenchLM`` gives every choice the
    loglikelihood lm-eval's own ``hf`` model gives it, loading the folder itself."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.downstream.frozen import ConditionLogits
    from fca_workbench.downstream.lm import WorkbenchLM

    model = load_controlled(tiny_mixtral)
    ours = WorkbenchLM(model, load_tokenizer(tiny_mixtral), model.context_length, 4)
    ours.use(ConditionLogits(session_of(model), "correct"))
    hf = {"pretrained": str(tiny_mixtral), "device": "cpu", "dtype": "float32"}
    scores = []
    for lm, args in ((ours, None), ("hf", hf)):
        results = lm_eval.simple_evaluate(
            model=lm,
            model_args=args,
            tasks=["fca_next_line"],
            task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
            limit=8,
            log_samples=True,
        )
        scores.append([r[0][0] for sample in results["samples"]["fca_next_line"] for r in sample["resps"]])
    assert len(scores[0]) == 8 * 4
    assert scores[0] == pytest.approx(scores[1], abs=1e-4)


def test_generation_is_greedy_under_the_condition(tiny_mixtral):
    """``correct`` generates what transformers' own greedy ``generate`` does, each left-padded text alone; a
    static profile generates the frozen model's greedy tokens, computed here one forward at a time."""
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.audit.assignment import profiles_of, routing_top_k
    from fca_workbench.downstream.frozen import ConditionLogits
    from fca_workbench.downstream.lm import WorkbenchLM

    model, tokenizer = load_controlled(tiny_mixtral), load_tokenizer(tiny_mixtral)
    lm = WorkbenchLM(model, tokenizer, model.context_length, 2)
    texts = [tokenizer.encode("Who's there?\n"), tokenizer.encode("Nay, answer me: stand, and unfold yourself.\n")]
    width, new = max(map(len, texts)), 6
    pad = tokenizer.pad_token_id
    context = torch.tensor([[pad] * (width - len(t)) + t for t in texts])
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in texts])
    lm.use(ConditionLogits(session_of(model), "correct"))
    out = lm._model_generate(context, width + new, stop=[], attention_mask=mask)
    for row, text in zip(out, texts):
        reference = model.model.generate(torch.tensor([text]), max_new_tokens=new, do_sample=False, min_new_tokens=new)
        assert row[width:].tolist() == reference[0, len(text) :].tolist()
    calibration = torch.tensor([texts[1]])
    with torch.no_grad():
        _, values = model.capture_run(calibration)
    batches = [(calibration, [v["coefficient"] for v in values])]
    profiles = profiles_of(batches, routing_top_k(values), calibration.unique())
    lm.use(ConditionLogits(session_of(model, profiles), "layer_mean"))
    ids = list(texts[0])
    for _ in range(new):
        coefficients = [{"coefficient": p.expand(1, len(ids), *p.shape)} for p in profiles["layer_mean"]]
        with torch.no_grad():
            ids.append(int(model.replay_run(torch.tensor([ids]), coefficients)[0, -1].argmax()))
    assert (
        lm._model_generate(context[:1], width + new, stop=[], attention_mask=mask[:1])[0, width:].tolist()
        == ids[len(texts[0]) :]
    )


def test_reproduce_runs_notebook_08_only_with_lm_eval(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "ensure_kernel", lambda: None)
    assert "08_downstream" in [job.name for job in reproduce.plan({}, tmp_path / "with").jobs]
    real = reproduce.importlib.util.find_spec
    monkeypatch.setattr(reproduce.importlib.util, "find_spec", lambda name: None if name == "lm_eval" else real(name))
    assert "08_downstream" not in [job.name for job in reproduce.plan({}, tmp_path / "without").jobs]
    with pytest.raises(UserError, match="needs the eval extra"):
        reproduce.plan({"notebooks": ["08_downstream"]}, tmp_path / "asked")


def test_rolling_loglikelihood_is_the_frozen_models(tiny_mixtral):
    """A rolling loglikelihood (perplexity tasks) under a static profile: the summed log-probability of every
    token after lm-eval's prefix token, from ``replay_run`` with the profile broadcast by hand."""
    from lm_eval.api.instance import Instance

    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.audit.assignment import profiles_of, routing_top_k
    from fca_workbench.downstream.frozen import ConditionLogits
    from fca_workbench.downstream.lm import WorkbenchLM

    model, tokenizer = load_controlled(tiny_mixtral), load_tokenizer(tiny_mixtral)
    text = "Who's there?\nNay, answer me: stand, and unfold yourself."
    ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer.encode(text)]])
    with torch.no_grad():
        _, values = model.capture_run(ids)
        batches = [(ids, [v["coefficient"] for v in values])]
        profiles = profiles_of(batches, routing_top_k(values), ids.unique())
        slots, scalars = model.coefficient_slot_shapes, profiles["layer_scalar"]
        replayed = [{"coefficient": p.expand(1, ids.shape[1], *slot)} for p, slot in zip(scalars, slots)]
        logprobs = model.replay_run(ids, replayed)[0, :-1].double().log_softmax(-1)
    expected = logprobs.gather(1, ids[0, 1:, None]).sum().item()
    lm = WorkbenchLM(model, tokenizer, model.context_length, 2)
    lm.use(ConditionLogits(session_of(model, profiles), "layer_scalar"))
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    assert lm.loglikelihood_rolling([request], disable_tqdm=True)[0] == pytest.approx(expected, abs=1e-4)


def test_notebook_08_shows_each_audits_downstream_json(tiny_reproduce):
    """``fca reproduce``'s notebook 08: ``downstream.json`` beside the audit of every model with a controller, and
    its table holds their numbers, value for value."""
    import pandas as pd

    plan, results, _, _ = tiny_reproduce
    assert results["08_downstream"].ok, results["08_downstream"].error
    table = pd.read_csv(plan.out / "tables" / "downstream.csv")
    gaps = pd.read_csv(plan.out / "tables" / "downstream_gaps.csv")
    expected, expected_gaps = [], []
    for name in ["featuregate-s0", "featuregate-s1", "muddpythia-s0", "moe-s0"]:
        downstream = json.loads((plan.out / "audits" / name / DOWNSTREAM_FILE).read_text())
        for condition, metrics in downstream["tasks"]["fca_next_line"]["conditions"].items():
            expected.append([name, condition, metrics["acc"]["value"], metrics["acc"]["stderr"]])
        for condition, metrics in downstream["tasks"]["fca_next_line"]["conditions"].items():
            g = metrics["acc"]["gap"]
            if g is not None:  # every condition but correct, paired over the same documents
                assert g["paired"] and g["clusters"] == downstream["tasks"]["fca_next_line"]["clusters"]["count"]
                expected_gaps.append([name, condition, g["value"], g["stderr"], "paired documents, clustered by play"])
    assert table[["model", "condition", "value", "stderr"]].values.tolist() == expected
    got = gaps[["model", "condition", "gap", "stderr", "over"]].astype(object).where(gaps.notna(), None)
    assert got.values.tolist() == expected_gaps
    assert not (plan.out / "audits" / "dense-s0" / DOWNSTREAM_FILE).exists()  # no controller: nothing to compare


def test_every_condition_is_paired_against_correct_and_a_routers_retention_follows_its_reference():
    """``task_figures``: each condition's gap against ``correct`` over the same documents, clustered by play; the
    top-k profile's retention against ``random_topk`` where it ran (``global_mean``'s beside it), else
    ``global_mean``."""
    plays = {d: ("play", str(d % 4)) for d in range(40)}
    scores = {
        "correct": [1.0] * 36 + [0.0] * 4,
        "global_mean": [float(d % 2) for d in range(40)],
        "layer_mean": [float(d % 5 != 0) for d in range(40)],
        "layer_mean_topk": [float(d % 3 != 0) for d in range(40)],
        "random_topk": [float(d % 4 == 0) for d in range(40)],
    }

    def results(docs):
        value = sum(docs) / len(docs)
        entry = {"samples": 40, "metrics": {"acc": {"value": value, "stderr": 0.07}}}
        return {"t": entry | {"documents": {"acc": dict(enumerate(docs))}, "clusters": ("play", plays)}}

    figures = task_figures({c: results(docs) for c, docs in scores.items()})["t"]
    assert figures["clusters"] == {"field": "play", "count": 4}
    for condition, docs in scores.items():
        g = figures["conditions"][condition]["acc"]["gap"]
        if condition == "correct":
            assert g is None
            continue
        assert g["paired"] and g["clusters"] == 4 and g["df"] == 3
        assert g["value"] == pytest.approx((sum(scores["correct"]) - sum(docs)) / 40)
    topk = figures["conditions"]["layer_mean_topk"]["acc"]["retention"]
    assert topk["reference"] == "random_topk" and topk["other_references"]["global_mean"]["reference"] == "global_mean"
    assert figures["conditions"]["layer_mean"]["acc"]["retention"]["reference"] == "global_mean"
    assert figures["conditions"]["random_topk"]["acc"]["retention"] is None  # a reference reports none
    without = task_figures({c: results(d) for c, d in scores.items() if c != "random_topk"})["t"]
    assert without["conditions"]["layer_mean_topk"]["acc"]["retention"]["reference"] == "global_mean"
