"""Audit work split over nodes: ``--shard K/N`` of ``fca audit-many`` and ``fca reproduce``, the assembly that
refuses a missing or mismatched shard in one line, and ``fca audit --capture-only`` (capture on one node,
replay on another). Split then assembled equals one unsharded run, figure for figure (latencies aside)."""

import argparse
import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_REPRODUCE_SETTINGS, second_seed
from test_reproduce import without_latency

from fca_workbench.cli import main
from fca_workbench.foundation import flags
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import reproduce

pytestmark = pytest.mark.timeout(900)
SMALL = ("--window", "32", "--max-windows", "4", "--batch-size", "2", "--resamples", "50", "--latency-repeats", "1")


def test_a_shard_is_k_of_n_and_the_shards_split_the_plan_exactly():
    assert flags.shard("1/3") == flags.Shard(1, 3) and str(flags.Shard(1, 3)) == "1/3"
    for bad in ("3/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(argparse.ArgumentTypeError, match="K/N"):
            flags.shard(bad)
    plan = list(range(10))
    parts = [flags.Shard(k, 3).take(plan) for k in range(3)]
    assert sorted(sum(parts, [])) == plan and parts[1] == [1, 4, 7]


def fca_ok(*args) -> None:
    assert main([str(a) for a in args]) == 0


def audit_figures(folder: Path) -> dict:
    """An audit's figures and per-token NLLs, without its paths and wall-clock latencies."""
    audit = json.loads((folder / "audit.json").read_text())
    keep = ("conditions", "retention", "variance", "variation", "per_layer", "replay_check", "model", "data")
    figures = {k: audit[k] for k in keep if k in audit}
    figures["model"] = {k: v for k, v in figures["model"].items() if k != "path"}
    figures["data"] = {s: {k: v for k, v in d.items() if k != "source"} for s, d in figures["data"].items()}
    with gzip.open(folder / "per_token_nll.csv.gz", "rt") as handle:
        return {**figures, "execution": without_latency(audit["execution"]), "per_token": handle.read()}


def many_figures(out: Path) -> dict:
    summary = json.loads((out / "audit_many.json").read_text())
    figures = {k: v for k, v in summary.pop("figures").items() if "latency" not in k}
    return {**summary, "figures": figures, "audits": {n: audit_figures(out / n) for n in summary["audits"]}}


@pytest.fixture(scope="module")
def three_seeds(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    return [
        tiny_checkpoints["dense"],
        tiny_checkpoints["featuregate"],
        second_seed(tiny_checkpoints["featuregate"], root / "featuregate-s1"),
    ]


def test_audit_many_split_in_two_then_assembled_equals_one_run(three_seeds, tmp_path, capsys):
    fca_ok("audit-many", *three_seeds, "--out", tmp_path / "one", *SMALL)
    split = tmp_path / "split"
    fca_ok("audit-many", *three_seeds, "--out", split, *SMALL, "--shard", "0/2")
    assert sorted(p.name for p in split.iterdir() if not p.name.startswith(".")) == [
        "dense",
        "featuregate-s1",
        "shards",
    ]
    assert main(["audit-many", *map(str, three_seeds), "--out", str(split), *SMALL, "--assemble"]) == 2
    assert "shard 1/2 has not finished" in capsys.readouterr().err
    fca_ok("audit-many", *three_seeds, "--out", split, *SMALL, "--shard", "1/2")
    fca_ok("audit-many", *three_seeds, "--out", split, *SMALL, "--assemble")
    assert many_figures(split) == many_figures(tmp_path / "one")


def test_assembly_refuses_a_mismatched_shard_in_one_line(three_seeds, tmp_path, capsys):
    out = tmp_path / "split"
    for k in range(2):
        fca_ok("audit-many", *three_seeds[:2], "--out", out, *SMALL, "--shard", f"{k}/2")
    capsys.readouterr()

    def refused(*args: object) -> str:
        assert main(["audit-many", *map(str, three_seeds[:2]), "--out", str(out), *SMALL, *map(str, args)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fca: error:")
        return lines[0]

    assert "ran another plan (its work differs)" in refused("--seed", "1", "--assemble")
    record = json.loads((out / "shards" / "0-of-2.json").read_text())
    (out / "shards" / "0-of-3.json").write_text(json.dumps({**record, "shard": [0, 3]}))
    assert "split 2 and 3 ways" in refused("--assemble")
    (out / "shards" / "0-of-3.json").write_text("[]")
    assert "holds a JSON array, not a JSON object" in refused("--assemble")
    (out / "shards" / "0-of-3.json").unlink()
    fca_ok("audit-many", *three_seeds[:2], "--out", out, *SMALL, "--assemble")


def test_capture_on_one_node_then_replay_on_another_from_the_copied_cache(tiny_checkpoints, tmp_path, capsys):
    checkpoint = tiny_checkpoints["featuregate"]
    fca_ok("audit", checkpoint, "--out", tmp_path / "a", "--cache", tmp_path / "cache-a", *SMALL, "--capture-only")
    assert not (tmp_path / "a" / "audit.json").exists()
    assert "captured into" in capsys.readouterr().out
    copied = Path(shutil.copytree(tmp_path / "cache-a", tmp_path / "node-b" / "cache"))  # another node's disk
    shards = sorted(copied.rglob("*.safetensors"))
    assert shards
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    fca_ok("audit", checkpoint, "--out", tmp_path / "b", "--cache", copied, *SMALL)
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards)  # replayed from the copy, nothing recaptured
    fca_ok("audit", checkpoint, "--out", tmp_path / "one", *SMALL)
    assert audit_figures(tmp_path / "b") == audit_figures(tmp_path / "one")


def test_reproduce_split_in_two_then_assembled_equals_one_run(tiny_checkpoints, tmp_path):
    config = tmp_path / "config.json"
    checkpoints = [str(tiny_checkpoints["dense"]), str(tiny_checkpoints["featuregate"])]
    parameters = {"checkpoints": checkpoints, **TINY_REPRODUCE_SETTINGS}
    runs = {}
    for name in ("one", "split"):
        config.write_text(
            json.dumps(
                {"notebooks": ["01_variation"], "cache": str(tmp_path / f"cache-{name}"), "parameters": parameters}
            )
        )
        if name == "split":
            reproduce.reproduce_shard(config, tmp_path / name, flags.Shard(0, 2), progress=False)
            with pytest.raises(UserError, match="shard 1/2 has not finished"):
                reproduce.reproduce(config, tmp_path / name, progress=False, assemble=True)
            reproduce.reproduce_shard(config, tmp_path / name, flags.Shard(1, 2), progress=False)
        plan, results = reproduce.reproduce(config, tmp_path / name, progress=False, assemble=name == "split")
        assert all(r.ok for r in results), [r.error for r in results]
        tables = sorted((plan.out / "tables").iterdir())
        runs[name] = {
            "audits": {n: audit_figures(plan.out / "audits" / n) for n in ("dense", "featuregate")},
            "tables": {p.name: p.read_text() for p in tables if p.suffix in (".csv", ".md")},
        }
    assert runs["split"]["tables"] and runs["split"] == runs["one"]
    with pytest.raises(UserError, match="need --out"):
        reproduce.reproduce_shard(config, None, flags.Shard(0, 2), progress=False)
