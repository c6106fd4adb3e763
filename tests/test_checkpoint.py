"""The checkpoint folder in one line: ``checkpoint.resolve_checkpoint`` resolves and checks it once, and
``adapters.loading.open_checkpoint`` loads it from there (device, placement, model, tokenizer checked against the
model) without resolving it again; what a finished checkpoint holds is named by ``fca_workbench.foundation.checkpoint``."""

import gc
import shutil

import pytest
import torch

from fca_workbench.adapters.controlled import load_controlled, open_checkpoint
from fca_workbench.adapters.placement import OFFLOAD_PREFIX, is_placed
from fca_workbench.audit.capture import model_fingerprint
from fca_workbench.foundation import checkpoint
from fca_workbench.foundation.checkpoint import Checkpoint, resolve_checkpoint
from fca_workbench.foundation.errors import UserError


@pytest.fixture(params=["featuregate", "mixtral"])
def folder(request, tiny_checkpoints, tiny_mixtral):
    return tiny_mixtral if request.param == "mixtral" else tiny_checkpoints[request.param]


def test_open_checkpoint_loads_the_model_and_its_tokenizer_without_resolving_again(folder, monkeypatch):
    resolved = resolve_checkpoint(folder)

    def resolved_again(*args, **kwargs):
        raise AssertionError("the checkpoint was resolved a second time")

    monkeypatch.setattr("fca_workbench.adapters.controlled.resolve_checkpoint", resolved_again)
    monkeypatch.setattr("fca_workbench.models.resolve_checkpoint", resolved_again)
    model, tokenizer = open_checkpoint(resolved, torch.float32)
    assert next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype == torch.float32
    assert len(tokenizer) <= model.config.vocab_size and tokenizer("ab")["input_ids"]
    monkeypatch.undo()
    assert model_fingerprint(model) == model_fingerprint(load_controlled(folder))  # the same weights as by name


def test_open_checkpoint_takes_the_dtype_and_the_controller_flags(tiny_checkpoints, tiny_mixtral):
    model, _ = open_checkpoint(Checkpoint(tiny_mixtral), torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16 and len(model.controllers) == 2  # a router per layer
    with pytest.raises(UserError, match="--controllers is for foreign models"):
        open_checkpoint(Checkpoint(tiny_checkpoints["dense"]), torch.float32, controllers="h")


def test_a_tokenizer_bigger_than_the_vocabulary_is_refused(tiny_checkpoints, tokenizer, tmp_path):
    folder = tmp_path / "mismatched"
    shutil.copytree(tiny_checkpoints["dense"], folder)
    bigger = tokenizer.__class__.from_pretrained(folder)
    bigger.add_tokens([f"<extra_{n}>" for n in range(8)])
    bigger.save_pretrained(folder)
    with pytest.raises(UserError, match=r"has 4104 tokens, more than the model's vocabulary of 4096"):
        open_checkpoint(resolve_checkpoint(folder), torch.float32)


def test_open_checkpoint_places_a_model_outside_the_folders_it_is_told(tiny_checkpoints, tmp_path):
    resolved = resolve_checkpoint(tiny_checkpoints["featuregate"])
    placing = dict(device_map="auto", max_memory="cpu=200KB")
    with pytest.raises(UserError, match="inside the checkpoint"):
        open_checkpoint(resolved, torch.float32, offload_folder=str(resolved.folder / "offload"), **placing)
    with pytest.raises(UserError, match="inside the output folder"):
        outside = {"output folder": tmp_path / "out"}
        open_checkpoint(
            resolved, torch.float32, offload_folder=str(tmp_path / "out" / "x"), offload_outside=outside, **placing
        )
    assert not (resolved.folder / "offload").exists() and not (tmp_path / "out").exists()
    model, _ = open_checkpoint(resolved, torch.float32, offload_folder=str(tmp_path / "offload"), **placing)
    assert is_placed(model) and [p.name.startswith(OFFLOAD_PREFIX) for p in (tmp_path / "offload").iterdir()] == [True]
    del model
    gc.collect()
    assert not any((tmp_path / "offload").iterdir())  # the offloaded weights went with the model


def test_open_checkpoint_refuses_a_device_it_cannot_compute_on_before_loading(tiny_checkpoints):
    with pytest.raises(UserError, match="--device meta cannot run a model"):
        open_checkpoint(resolve_checkpoint(tiny_checkpoints["dense"]), torch.float32, device="meta")


def test_a_finished_checkpoint_holds_the_files_the_checkpoint_module_names(tiny_checkpoints):
    saved = {path.name for path in tiny_checkpoints["featuregate"].iterdir()}
    assert checkpoint.CONFIG_FILE in saved and checkpoint.SAFETENSORS_FILE in saved
    assert {checkpoint.TOKENIZER_FILE, checkpoint.TOKENIZER_CONFIG_FILE} <= saved
    assert checkpoint.WEIGHT_FILES[: len(checkpoint.SAFETENSORS_WEIGHTS)] == checkpoint.SAFETENSORS_WEIGHTS
