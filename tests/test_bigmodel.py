"""Models bigger than one device (accelerate's big-model inference): a model whose weights exceed
``--max-memory`` audits with disk offload and gives the in-memory audit's figures; the flags' bad values are one
line; the offload folder never lies in the checkpoint, the output or the cache, and nothing the user had in it
is lost; under torchrun each rank places its own model."""

import gc
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import assert_one_line_error, fca, refused_before_anything

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.adapters.placement import OFFLOAD_PREFIX, is_placed, parse_max_memory, placement
from fca_workbench.audit.capture import model_fingerprint
from fca_workbench.audit.distributed import Ranks
from fca_workbench.audit.inputs import load_audit_model
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.errors import UserError

BUDGET = "cpu=200KB"  # far less than the tiny models' weights (2 MB and more)
ROOT = Path(__file__).resolve().parents[1]


def settings(checkpoint, **overrides):
    base = dict(checkpoint=str(checkpoint), window=32, max_windows=4, batch_size=2, latency_repeats=1, resamples=20)
    return AuditSettings(**{**base, **overrides})


def offloaded(checkpoint, folder, **overrides):
    return settings(checkpoint, device_map="auto", max_memory=BUDGET, offload_folder=str(folder), **overrides)


def per_token(out: Path) -> pd.DataFrame:
    with gzip.open(out / "per_token_nll.csv.gz", "rt") as handle:
        return pd.read_csv(handle)


@pytest.fixture(params=["featuregate", "mixtral"])
def checkpoint(request, tiny_checkpoints, tiny_mixtral):
    return tiny_mixtral if request.param == "mixtral" else tiny_checkpoints[request.param]


def test_a_model_bigger_than_max_memory_audits_with_disk_offload_to_the_in_memory_figures(checkpoint, tmp_path):
    weights = sum(p.numel() * p.element_size() for p in load_controlled(checkpoint).parameters())
    assert weights > 5 * parse_max_memory(BUDGET)["cpu"]
    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / "notes.txt").write_text("the user's own file")

    model, _ = load_audit_model(offloaded(checkpoint, offload), tmp_path / "out")
    assert is_placed(model) and any(p.device.type == "meta" for p in model.parameters())  # weights on disk
    spaces = [p for p in offload.iterdir() if p.name.startswith(OFFLOAD_PREFIX)]
    assert len(spaces) == 1  # a fresh subfolder of the one named, for as long as the model lives
    assert model_fingerprint(model) == model_fingerprint(load_controlled(checkpoint))  # streamed, the same weights
    del model
    gc.collect()
    assert [p.name for p in offload.iterdir()] == ["notes.txt"]

    memory = run_audit(settings(checkpoint), tmp_path / "memory")
    placed = run_audit(offloaded(checkpoint, offload), tmp_path / "placed")
    gc.collect()
    assert placed["model"]["fingerprint"] == memory["model"]["fingerprint"]
    assert placed["settings"]["device_map"] == "auto" and placed["settings"]["max_memory"] == BUDGET
    assert memory["conditions"].keys() == placed["conditions"].keys()
    for name, figures in memory["conditions"].items():
        for key in ("nll", "delta"):
            assert abs(figures[key] - placed["conditions"][name][key]) <= 1e-6, (name, key)
    tokens = per_token(tmp_path / "memory"), per_token(tmp_path / "placed")
    assert list(tokens[0].columns) == list(tokens[1].columns) and len(tokens[0]) == 4 * 31
    assert (tokens[0] - tokens[1]).abs().max().max() <= 1e-6
    assert [p.name for p in offload.iterdir()] == ["notes.txt"]  # nothing of the user's lost, nothing of ours left
    assert (offload / "notes.txt").read_text() == "the user's own file"


def test_a_device_map_file_places_modules_where_it_says(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"wte": "cpu", "wpe": "cpu", "h": "disk", "ln_f": "cpu", "lm_head": "cpu"}))
    model, _ = load_audit_model(settings(folder, device_map=str(mapping), offload_folder=str(tmp_path / "off")))
    held = load_controlled(folder)
    assert all(p.device.type == "meta" for p in model.h.parameters())
    assert all(p.device.type == "cpu" for p in model.lm_head.parameters())
    ids = torch.randint(0, 4096, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, held(ids).logits)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu=200MB", {"cpu": 200 * 10**6}),
        ("0=10GiB,cpu=30GiB", {0: 10 * 2**30, "cpu": 30 * 2**30}),
        (" 1 = 512MiB , cpu=1KB", {1: 512 * 2**20, "cpu": 1000}),
    ],
)
def test_max_memory_is_read_into_accelerates_dict(text, expected):
    assert parse_max_memory(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cpu=lots", "is not a size"),
        ("cpu=0MB", "is not a size"),
        ("cpu", "DEVICE=SIZE"),
        ("gpu=1GiB", "DEVICE=SIZE"),
        ("cpu=1GiB,cpu=2GiB", "names cpu twice"),
    ],
)
def test_a_bad_max_memory_is_one_line(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_max_memory(text)


@pytest.mark.parametrize(
    ("size", "fragment"),
    [
        ("infGB", "is not a size"),
        ("1e400GB", "is not a size"),
        ("nanGB", "is not a size"),
        ("-1GB", "is not a size"),
        ("0GB", "above 0"),
        ("1e30GB", "more than 1 PiB"),
    ],
)
def test_a_max_memory_size_must_be_finite_positive_and_bounded(tiny_checkpoints, tmp_path, capsys, size, fragment):
    argv = ["audit", tiny_checkpoints["featuregate"], "--device-map", "auto", "--max-memory", f"cpu=1GB,0={size}"]
    refused_before_anything(argv, tmp_path / "out", capsys, "--max-memory", repr(size), fragment)
    refused_before_anything(argv[:-1] + [f"cpu={size}"], tmp_path / "out", capsys, fragment)


def test_a_device_map_naming_modules_the_model_lacks_is_refused_before_any_capture(checkpoint, tmp_path, capsys):
    """transformers takes a map of names the model does not have and places nothing by them; the audit would
    record the map as if it had placed the model."""
    mapping = tmp_path / "map.json"
    offload = tmp_path / "offload"
    for placed in ({"transformer.nonexistent": "cpu", "bogus": "disk"}, {"": "cpu", "h.99": "cpu"}):
        mapping.write_text(json.dumps(placed))
        unknown = [name for name in placed if name]
        argv = ["audit", checkpoint, "--device-map", mapping, "--offload-folder", offload]
        refused_before_anything(
            argv, tmp_path / "out", capsys, f"names {len(unknown)} module(s) the model does not have", repr(unknown[0])
        )
        assert list(offload.iterdir()) == []  # the offload subfolder made for the load is removed


def test_bad_placements_are_refused_before_anything_is_made(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    bad_map = tmp_path / "bad.json"
    bad_map.write_text(json.dumps({"": "moon"}))
    good_map = tmp_path / "good.json"
    good_map.write_text(json.dumps({"": "cpu"}))
    cases = [
        (dict(device_map=None, max_memory=BUDGET), "give --device-map auto too"),
        (dict(device_map=None, offload_folder=str(tmp_path)), "give --device-map auto too"),
        (dict(device_map="everywhere"), "auto, balanced"),
        (dict(device_map=str(bad_map)), "placed on 'moon'"),
        (dict(device_map="auto", max_memory="0=1GiB"), "give --device cuda"),
        (dict(device_map="auto", offload_folder=str(folder / "offload")), "inside the checkpoint"),
        (dict(device_map="auto", offload_folder=str(tmp_path / "out" / "x")), "inside the output folder"),
        (dict(device_map="auto", offload_folder=str(tmp_path / "c"), cache=str(tmp_path)), "inside the coefficient"),
        (dict(device_map="auto", offload_folder=str(folder / "config.json")), "inside the checkpoint"),
    ]
    for overrides, fragment in cases:
        with pytest.raises(UserError, match=fragment):
            load_audit_model(settings(folder, **overrides), tmp_path / "out")
    assert not (folder / "offload").exists() and not (tmp_path / "out").exists()
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match="is a file"):
        load_audit_model(settings(folder, device_map="auto", offload_folder=str(tmp_path / "afile")))
    outside = {"checkpoint": folder}
    two_ranks = Ranks(rank=1, world_size=2, device=torch.device("cpu"))
    with pytest.raises(UserError, match="under torchrun"):  # the same file would put every rank on the same devices
        placement(str(good_map), None, None, "cpu", outside, two_ranks)
    on_gpu = Ranks(rank=1, world_size=2, device=torch.device("cuda", 1))
    with pytest.raises(UserError, match="name only cpu"):
        placement("auto", "1=1GiB", None, "cuda", outside, on_gpu)


def test_the_cli_takes_the_placement_flags_and_says_a_bad_value_in_one_line(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    result = fca("audit", folder, "--device-map", "auto", "--max-memory", "cpu=lots", "--out", tmp_path / "out")
    assert_one_line_error(result, "--max-memory", "is not a size")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(400)
def test_two_torchrun_ranks_each_place_their_own_model_and_give_the_one_process_figures(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints["featuregate"]
    one = run_audit(settings(folder, cache=str(tmp_path / "cache")), tmp_path / "one")
    args = ["audit", folder, "--out", tmp_path / "two", "--cache", tmp_path / "cache", "--window", 32]
    args += ["--max-windows", 4, "--batch-size", 2, "--latency-repeats", 1, "--resamples", 20]
    args += ["--device-map", "auto", "--max-memory", BUDGET, "--offload-folder", tmp_path / "offload"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [*launcher, "-m", "fca_workbench", *map(str, args)], capture_output=True, text=True, env=env, timeout=380
    )
    assert result.returncode == 0, result.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "audit.json").read_text())
    assert two["settings"]["world_size"] == 2
    for name, figures in one["conditions"].items():
        assert abs(figures["nll"] - two["conditions"][name]["nll"]) <= 1e-6, name
    assert list((tmp_path / "offload").iterdir()) == []  # each rank's own subfolder, removed
