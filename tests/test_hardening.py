"""Attacks and careless uses (issue 16): planted pickles, damaged caches, absurd configs, output folders the
workbench did not write, weights from outside the checkpoint folder. Each is refused with one line."""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from fca_workbench.data import read_documents, split_path
from fca_workbench.errors import UserError
from fca_workbench.train import CHECKPOINT_FILES, STATE_FILE, TrainSettings, train
from test_cli import assert_one_line_error, fca


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:20_000], encoding="utf-8")
    return str(path)


def tiny_run(small_text, arch="featuregate", **overrides):
    settings = dict(arch=arch, train_data=small_text, layers=2, width=32, heads=4, window=32, steps=4,
                    batch_size=2, warmup=1, save_every=2, eval_windows=2)
    return TrainSettings(**{**settings, **overrides})


# ----------------------------------------------------------------------------------------------------------
# 1. no code from a planted trainer_state.pt


class PlantedCode:
    """Unpickling this calls ``open(marker, "w")``: it creates the marker file, the proof code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_planted_pickle_in_the_run_folder_never_runs(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "code-ran"
    run.mkdir()
    torch.save({"settings": PlantedCode(marker), "step": 0}, run / STATE_FILE)
    result = fca("train", "--arch", "dense", "--out", run)
    assert not marker.exists()
    assert result.returncode == 2
    assert_one_line_error(result, "trainer_state.pt is not a training state fca train wrote")


def test_genuine_state_still_resumes_through_the_safe_unpickler(small_text, tmp_path):
    settings = tiny_run(small_text)
    assert train(settings, tmp_path / "run", stop_after=2) is None
    state = torch.load(tmp_path / "run" / STATE_FILE, weights_only=True)
    assert state["step"] == 2
    assert train(settings, tmp_path / "run") is not None
    assert not (tmp_path / "run" / STATE_FILE).exists()


# ----------------------------------------------------------------------------------------------------------
# 6. fca train: output folders


def test_train_never_replaces_a_users_readme(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "README.md").write_text("my notes")
    result = fca("train", "--arch", "dense", "--out", run)
    assert_one_line_error(result, "README.md", "did not write")
    assert (run / "README.md").read_text() == "my notes"
    assert sorted(os.listdir(run)) == ["README.md"]  # refused before training: nothing written


def test_train_out_file_is_one_line(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    assert_one_line_error(fca("train", "--arch", "dense", "--out", path), "is a file, not a folder")
    assert path.read_text() == "x"


def test_train_out_dot_trains_into_the_current_folder(small_text, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("kept")  # a file the checkpoint does not need: left alone
    monkeypatch.chdir(run)
    card = train(tiny_run(small_text, steps=2), ".")
    assert card["params"] > 0
    assert (run / "notes.txt").read_text() == "kept"
    assert set(os.listdir(run)) - {"notes.txt"} <= set(CHECKPOINT_FILES)
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(run))


@pytest.mark.parametrize("arch", ["dense", "muddpythia"])
def test_checkpoint_files_names_everything_a_finished_run_writes(arch, small_text, tmp_path):
    train(tiny_run(small_text, arch=arch, steps=2), tmp_path / "run")
    assert set(os.listdir(tmp_path / "run")) <= set(CHECKPOINT_FILES)
