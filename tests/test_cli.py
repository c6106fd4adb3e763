"""The ``fca`` command line: help lists the commands; user errors are one line, non-zero, no traceback."""

import argparse
import json
import re
from pathlib import Path

import pytest
from conftest import assert_one_line_error, fca, refused_before_anything, tiny_model

from fca_workbench.cli import build_parser, main
from fca_workbench.cli.flag_settings import audit_settings
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.results.conditions import LAYER_MEAN_TOPK

pytestmark = pytest.mark.timeout(300)  # every test runs `fca` in a subprocess: a hang fails after 5 min


def test_help_lists_the_commands():
    """The usage line's ``{...}`` choices, parsed exactly (``audit`` is not found inside ``audit-many``), are the
    parser's subcommands, include the core ones, and each is documented in the README."""
    result = fca("--help")
    assert result.returncode == 0
    listed = (
        re.search(r"usage: fca \[-h\] \[--version\]\s+\{([^}]*)\}", result.stdout)
        .group(1)
        .replace("\n", "")
        .replace(" ", "")
        .split(",")
    )
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert listed == list(subparsers.choices)
    assert {"data", "train", "audit", "audit-many", "dashboard", "reproduce"} <= set(listed)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for command in listed:
        assert re.search(rf"^ *fca {re.escape(command)}( |$)", readme, re.MULTILINE), command


def test_missing_checkpoint(tmp_path):
    assert_one_line_error(fca("audit", tmp_path / "nowhere", "--out", tmp_path / "out"), "not found")
    assert not (tmp_path / "out").exists()


def test_folder_without_config(tmp_path):
    (tmp_path / "ckpt").mkdir()
    assert_one_line_error(fca("audit", tmp_path / "ckpt", "--out", tmp_path / "out"), "no config.json")


def test_corrupt_weights(tiny_checkpoints, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in tiny_checkpoints["featuregate"].iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00garbage, not safetensors")
    assert_one_line_error(fca("audit", broken, "--out", tmp_path / "out"), "corrupt or missing weights")
    assert not (tmp_path / "out" / "audit.json").exists()


def test_corrupt_config(tiny_checkpoints, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert_one_line_error(fca("audit", broken, "--out", tmp_path / "out"), "checkpoint config")


def test_foreign_model_type(tmp_path):
    """A transformers model_type is loaded through the adapter (tests/test_moe.py); broken ones are one line."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert_one_line_error(fca("audit", folder, "--out", tmp_path / "out"), "no safetensors weights")
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    assert_one_line_error(fca("audit", folder, "--out", tmp_path / "out"), "neither the workbench nor transformers")


@pytest.mark.parametrize("payload, fragment", [(b"", "contains no text"), (b"\xff\xfe bad bytes", "not UTF-8")])
def test_bad_eval_text(tiny_checkpoints, tmp_path, payload, fragment):
    text = tmp_path / "eval.txt"
    text.write_bytes(payload)
    result = fca("audit", tiny_checkpoints["featuregate"], "--eval", text, "--out", tmp_path / "out")
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "out" / "audit.json").exists()


def test_window_longer_than_context(tiny_checkpoints, tmp_path):
    result = fca("audit", tiny_checkpoints["featuregate"], "--window", 65, "--out", tmp_path / "out")
    assert_one_line_error(result, "longer than the model's context of 64")


def test_train_with_unreadable_text(tmp_path):
    text = tmp_path / "train.txt"
    text.write_bytes(b"\xc3\x28")
    result = fca("train", "--arch", "dense", "--train", text, "--out", tmp_path / "run")
    assert_one_line_error(result, "not UTF-8")


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path):
    folder = tmp_path / "small-vocab"
    tiny_model("featuregate", vocab_size=64, window=64).save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    assert_one_line_error(fca("audit", folder, "--out", tmp_path / "out"), "do not belong together")


@pytest.mark.parametrize("command", [["audit", "ckpt"], ["audit-many", "ckpt", "ckpt2"]])
def test_per_layer_flag_reaches_the_audit_settings(command):
    parser = build_parser()
    assert audit_settings(parser.parse_args(command + ["--per-layer"]), "ckpt").per_layer is True
    assert audit_settings(parser.parse_args(command), "ckpt").per_layer is False


def test_eval_of_a_router_condition_on_a_model_without_routers_is_refused_before_any_capture(
    tiny_checkpoints, tmp_path, capsys, monkeypatch
):
    """``--conditions layer_mean_topk`` needs top-k routers: refused once the model is known, before the
    calibration capture (any capture here fails the test) and before ``--out`` is claimed."""
    pytest.importorskip("lm_eval")
    from fca_workbench.audit.session import ReplaySession

    def no_capture(*args, **kwargs):
        raise AssertionError("a coefficient cache was opened before the refusal")

    monkeypatch.setattr(ReplaySession, "cache", no_capture)
    argv = ["eval", tiny_checkpoints["featuregate"], "--tasks", "fca_next_line", "--conditions", LAYER_MEAN_TOPK]
    argv += ["--limit", 2, "--max-windows", 2]
    main([*map(str, argv), "--out", str(tmp_path / "out")])  # the task's split generated once: its progress
    capsys.readouterr()  # lines on stderr are the datasets library's, not the refusal's
    refused_before_anything(argv, tmp_path / "out", capsys, LAYER_MEAN_TOPK, "top-k routers")
