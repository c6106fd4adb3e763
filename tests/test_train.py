"""``fca train``: the loss goes down, and an interrupted run resumes to the same weights."""

import csv

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import fca_workbench  # noqa: F401
from fca_workbench.data import read_documents, split_path
from fca_workbench.train import TrainSettings, train


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    """A slice of the calibration split, so tests don't tokenize the whole train split."""
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:40_000], encoding="utf-8")
    return str(path)


def tiny_settings(arch, small_text, **overrides):
    settings = dict(
        arch=arch, train_data=small_text, layers=2, width=32, heads=4, window=32, steps=40,
        batch_size=8, lr=1e-2, warmup=5, save_every=10, eval_windows=4,
    )
    return TrainSettings(**{**settings, **overrides})


def losses(folder):
    with (folder / "train_log.csv").open() as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("arch", ["dense", "featuregate", "muddpythia"])
def test_short_training_lowers_the_loss_and_saves_a_loadable_checkpoint(arch, small_text, tmp_path):
    card = train(tiny_settings(arch, small_text), tmp_path / "run")
    history = losses(tmp_path / "run")
    assert len(history) == 40
    assert sum(history[-5:]) / 5 < sum(history[:5]) / 5 - 1.0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert card["params"] == sum(p.numel() for p in model.parameters())
    assert not (tmp_path / "run" / "trainer_state.pt").exists()
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    assert (arch == "dense") == (card["within_layer_coefficient_std"] is None)


def test_interrupted_run_resumes_from_its_step_to_identical_weights(small_text, tmp_path):
    settings = tiny_settings("featuregate", small_text, steps=12, save_every=4)
    train(settings, tmp_path / "whole")
    assert train(settings, tmp_path / "split", stop_after=6) is None
    state = torch.load(tmp_path / "split" / "trainer_state.pt", weights_only=True)  # the safe unpickler reads it
    assert state["step"] == 6
    assert len(losses(tmp_path / "split")) == 6
    train(settings, tmp_path / "split")
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model.safetensors")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)
