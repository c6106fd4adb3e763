"""Audits on torch.distributed: ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) gives the figures of
one process, shares its cache with one process both ways, fails when a rank dies and resumes on rerun; the
cache lock and the rank checks stop a run with one line before anything is written.

The single-process audit of the same checkpoint, windows and seed is the independent computation every
two-rank figure is checked against. Runs are shared between tests through module-scoped fixtures and kept
tiny (8 or 4 windows of 64 tokens, one window per shard) so the file stays fast.
"""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from filelock import FileLock

from fca_workbench.audit.cache_lock import lock_path
from fca_workbench.audit.distributed import Ranks
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.audit.torchrun import EveryRankError
from fca_workbench.cli import main as fca_main
from fca_workbench.data.corpus import split_path
from fca_workbench.results.conditions import BASELINES

pytestmark = pytest.mark.timeout(300)  # every test but one runs torchrun or fca in a subprocess

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "data" / "checkpoints"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
FIGURES = ("conditions", "retention", "variance", "variation", "per_layer")
TOLERANCE = 1e-6


@pytest.fixture(scope="module", autouse=True)
def short_texts(tmp_path_factory):
    """The opening 20,000 characters of the shipped eval and calibration splits, as text files: the same
    kind of windows, without tokenizing whole splits in every process."""
    folder = tmp_path_factory.mktemp("text")
    for split in TEXT:
        with gzip.open(split_path(split), "rt", encoding="utf-8") as lines:
            text = "".join(json.loads(line)["text"] for line in lines)
        TEXT[split] = folder / f"{split}.txt"
        TEXT[split].write_text(text[:20_000], encoding="utf-8")


TEXT = {"eval": None, "calibration": None}  # filled by short_texts


def options(windows=8, *extra):
    return [
        "--eval",
        TEXT["eval"],
        "--calib",
        TEXT["calibration"],
        "--window",
        64,
        "--max-windows",
        windows,
        "--batch-size",
        1,
        *extra,
    ]


def audit_args(checkpoint, out, cache, windows=8, *extra):
    return ["audit", CHECKPOINTS / checkpoint, "--out", out, "--cache", cache, *options(windows, *extra)]


def command(args, ranks: int) -> list[str]:
    """``python -m fca_workbench ARGS``, under ``torchrun --standalone --nproc-per-node RANKS`` when ranks > 1
    (``python -m torch.distributed.run`` is torchrun, run by this interpreter)."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        if ranks > 1
        else [sys.executable]
    )
    return [*launcher, "-m", "fca_workbench", *map(str, args)]


def fca(args, ranks: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(command(args, ranks), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=280)


def audited(args, ranks: int = 1, folder=None) -> dict:
    """The audit ``fca ARGS`` wrote in ``folder`` (default: its --out)."""
    result = fca(args, ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((Path(folder or args[args.index("--out") + 1]) / "audit.json").read_text())


def numbers(tree, path=""):
    """Every number in ``tree`` by its path (lists by index), so two audits are compared leaf by leaf."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in numbers(value, f"{path}.{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree) for k, v in numbers(value, f"{path}[{i}]").items()}
    return {path: tree}


def assert_same_figures(one: dict, two: dict, keys=FIGURES) -> None:
    """NLL, CIs, ΔNLL, retention, R², variation and the per-layer rows equal within 1e-6 (layer and condition
    names exactly)."""
    for key in keys:
        a, b = numbers(one.get(key)), numbers(two.get(key))
        assert a.keys() == b.keys(), key
        for path, value in a.items():
            if isinstance(value, float):
                assert abs(value - b[path]) <= TOLERANCE, (path, value, b[path])
            else:
                assert value == b[path], path


def shard_files(cache: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime in ns) of every shard: a recaptured shard is a new file (written to a temp name, renamed)."""
    return {
        f"{p.parent.name}/{p.name}": (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(cache.glob("*/shard_*.safetensors"))
    }


def claims(cache: Path) -> dict[str, dict]:
    return {
        split.name: json.loads((split / "manifest.json").read_text())
        for split in sorted(cache.iterdir())
        if (split / "manifest.json").is_file()
    }


def one_line_error(result, *fragments) -> str:
    """Our one-line error, printed once (rank 0) whatever torchrun prints around it."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("fca: error:")]
    assert result.returncode != 0 and len(lines) == 1, result.stderr[-3000:]
    assert not re.search(r'File ".*fca_workbench', result.stderr), result.stderr[-3000:]  # no traceback of ours
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------------
# Shared runs
# ------------------------------------------------------------------------------------------------------


def ranks_of(launcher: psutil.Process, count: int, timeout: float = 200) -> dict[int, psutil.Process]:
    """torchrun's worker processes by their RANK."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = {}
        for child in launcher.children(recursive=True):
            try:
                if "RANK" in child.environ():
                    workers[int(child.environ()["RANK"])] = child
            except psutil.Error:
                pass
        if len(workers) == count:
            return workers
        time.sleep(0.05)
    raise AssertionError("torchrun did not start its workers")


def killed_mid_capture(args, cache: Path) -> int:
    """Start the two-rank audit ``args``; once the eval manifest claims rank 0's first shard, stop rank 0 (rank 1
    then finishes its share and waits for it), then kill it. torchrun's exit status. The claim is awaited, not
    the shard file: a rank stopped between renaming its shard and claiming it leaves a manifest claiming none."""
    launcher = subprocess.Popen(
        command(args, 2), env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        rank0 = ranks_of(psutil.Process(launcher.pid), 2)[0]
        manifest = cache / "eval" / "manifest.json"
        deadline = time.monotonic() + 200
        while not (manifest.is_file() and "shard_00000.safetensors" in json.loads(manifest.read_text())["shards"]):
            assert launcher.poll() is None and time.monotonic() < deadline, "the run ended before its first shard"
            time.sleep(0.001)
        rank0.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # rank 1 writes what it can and waits for rank 0
        rank0.send_signal(signal.SIGKILL)
        return launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()


@pytest.fixture(scope="module")
def featuregate(tmp_path_factory):
    """featuregate-s0 with --per-layer: ``fca audit`` in one process; then ``fca audit-many`` of it on two ranks,
    one killed mid-capture, and the rerun."""
    root = tmp_path_factory.mktemp("featuregate")
    one = audited(audit_args("featuregate-s0", root / "one", root / "cache-one", 8, "--per-layer"))
    many = ["audit-many", CHECKPOINTS / "featuregate-s0", "--out", root / "many", *options(8, "--per-layer")]
    folder = root / "many" / "featuregate-s0"  # audit-many's folder for the checkpoint, its cache inside
    status = killed_mid_capture(many, folder / "cache")
    killed = {
        "status": status,
        "manifests": claims(folder / "cache"),
        "shards": shard_files(folder / "cache"),
        "audit_written": (folder / "audit.json").exists(),
    }
    two = audited(many, ranks=2, folder=folder)
    summary = json.loads((root / "many" / "audit_many.json").read_text())
    return {
        "one": one,
        "two": two,
        "killed": killed,
        "summary": summary,
        "caches": {"one": root / "cache-one", "two": folder / "cache"},
        "folders": {"one": root / "one", "two": folder},
    }


@pytest.fixture(scope="module")
def muddpythia(tmp_path_factory):
    """muddpythia-s0: two ranks capture, then one process audits from their cache."""
    root = tmp_path_factory.mktemp("muddpythia")
    two = audited(audit_args("muddpythia-s0", root / "two", root / "cache", 4), ranks=2)
    before = shard_files(root / "cache")
    one = audited(audit_args("muddpythia-s0", root / "one", root / "cache", 4))
    return one, two, before, shard_files(root / "cache")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The shipped mixture-of-experts model: one process captures, then two ranks audit from its cache."""
    root = tmp_path_factory.mktemp("moe")
    one = audited(audit_args("moe-s0", root / "one", root / "cache", 4))
    before = shard_files(root / "cache")
    two = audited(audit_args("moe-s0", root / "two", root / "cache", 4), ranks=2)
    return one, two, before, shard_files(root / "cache")


# ------------------------------------------------------------------------------------------------------
# Two ranks give one process's figures
# ------------------------------------------------------------------------------------------------------


def test_two_ranks_give_the_figures_of_one_process_featuregate_per_layer(featuregate):
    one, two, caches = featuregate["one"], featuregate["two"], featuregate["caches"]
    assert_same_figures(one, two)
    interventions = [c for c in two["conditions"] if c not in BASELINES]
    assert len(two["per_layer"]) == 4 * len(interventions)  # 4 layers x every intervention, gathered from both ranks
    assert (one["settings"]["world_size"], two["settings"]["world_size"]) == (1, 2)
    # the ranks wrote the shards one process writes, byte for byte, under the same global numbering
    assert {s: m["shards"] for s, m in claims(caches["two"]).items()} == {
        s: m["shards"] for s, m in claims(caches["one"]).items()
    }
    assert len(claims(caches["two"])["eval"]["shards"]) == 8
    # audit-many on two ranks: rank 0 wrote the summary of its one checkpoint
    assert featuregate["summary"]["figures"]["conditions.cross_input.delta"]["values"] == [
        two["conditions"]["cross_input"]["delta"]
    ]
    import pandas as pd

    tokens = [pd.read_parquet(folder / "per_token_nll.parquet") for folder in featuregate["folders"].values()]
    assert tokens[0].shape == tokens[1].shape == (8 * 63, 3 + len(one["conditions"]))
    assert (tokens[0] - tokens[1]).abs().max().max() <= TOLERANCE


def test_a_cache_made_by_two_ranks_is_reused_by_one_process_muddpythia(muddpythia):
    one, two, before, after = muddpythia
    assert_same_figures(one, two)
    assert len(before) == 2 * 4 and after == before  # eval and calibration: not one shard captured again


def test_a_cache_made_by_one_process_is_reused_by_two_ranks_moe(moe):
    one, two, before, after = moe
    assert_same_figures(one, two)
    assert "layer_mean_topk" in two["conditions"] and two["execution"]["expert_fraction_executed"] < 1
    assert len(before) == 2 * 4 and after == before


# ------------------------------------------------------------------------------------------------------
# A rank dies mid-capture: the run fails; the rerun resumes from the finished shards
# ------------------------------------------------------------------------------------------------------


def test_a_rank_killed_mid_capture_stops_the_run_and_the_rerun_resumes(featuregate):
    """Killed while rank 1 waited for rank 0 to finish its share, the eval capture never completed; the rerun
    (the two-rank audit checked against one process above) kept every shard the manifest claimed."""
    killed, cache = featuregate["killed"], featuregate["caches"]["two"]
    assert killed["status"] != 0 and not killed["audit_written"]
    eval_manifest = killed["manifests"]["eval"]
    assert not eval_manifest["complete"] and "calibration" not in killed["manifests"]
    claimed = {f"eval/{name}" for name in eval_manifest["shards"]}
    assert claimed and len(claimed) < 8
    after = shard_files(cache)
    assert {name: after[name] for name in claimed} == {name: killed["shards"][name] for name in claimed}
    assert len(after) == 2 * 8 and claims(cache)["eval"]["complete"]
    assert_same_figures(featuregate["one"], featuregate["two"])


# ------------------------------------------------------------------------------------------------------
# One-line errors, nothing written
# ------------------------------------------------------------------------------------------------------


def test_a_second_audit_on_a_locked_cache_folder_waits_then_fails_with_one_line(tmp_path, capsys):
    """Another audit holds the cache folder's lock (taken here, as ``cache_lock`` takes it): this one waits
    ``--lock-wait`` seconds, then stops with one line, having written nothing."""
    cache = tmp_path / "cache"
    cache.mkdir()
    with FileLock(lock_path(cache)):
        started = time.monotonic()
        status = fca_main(
            [str(a) for a in audit_args("featuregate-s0", tmp_path / "out", cache, 2, "--lock-wait", 1.5)]
        )
        waited = time.monotonic() - started
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1 and error[0].startswith("fca: error: coefficient cache"), error
    assert "in use by another audit" in error[0] and "--lock-wait" in error[0]
    assert waited >= 1.5
    assert sorted(p.name for p in cache.iterdir()) == [lock_path(cache).name] and not (tmp_path / "out").exists()


class FirstOfTwo(Ranks):
    """Rank 0 of two for the shard split, with no other process to compare fingerprints with."""

    def agree(self, facts):
        pass


def test_more_ranks_than_shards_is_one_line_and_writes_nothing(tmp_path):
    """2 windows in one shard cannot feed 2 ranks: stopped after loading, before the lock or any capture."""
    settings = AuditSettings(
        str(CHECKPOINTS / "featuregate-s0"),
        eval=str(TEXT["eval"]),
        calibration=str(TEXT["calibration"]),
        window=64,
        max_windows=2,
        batch_size=2,
    )
    with pytest.raises(EveryRankError, match=r"^2 ranks, but the eval set makes only 1 shard\(s\).*--batch-size$"):
        run_audit(settings, tmp_path / "out", FirstOfTwo(0, 2))
    assert list(tmp_path.iterdir()) == []


def test_ranks_that_disagree_about_the_data_stop_with_one_line_and_write_nothing(tmp_path):
    """Each rank reads its own eval file (as nodes without a shared filesystem might): caught before any write."""
    for rank in (0, 1):
        (tmp_path / f"eval{rank}.txt").write_text(f"To be, or not to be{'!' * rank}: that is the question.\n" * 40)
    script = (
        f"exec {sys.executable} -m fca_workbench audit {CHECKPOINTS / 'featuregate-s0'} --out {tmp_path / 'out'} "
        f"--window 64 --batch-size 2 --eval {tmp_path}/eval$LOCAL_RANK.txt --calib {TEXT['calibration']}"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-python",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=280,
    )
    one_line_error(result, "ranks disagree about the eval windows", "rank 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval0.txt", "eval1.txt"]


# ------------------------------------------------------------------------------------------------------
# The shard split (no processes needed)
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("shards", [5, 7, 12])
def test_rank_shares_are_contiguous_cover_every_shard_once_and_differ_by_at_most_one(world_size, shards):
    shares = [Ranks(rank, world_size).share(shards) for rank in range(world_size)]
    assert [s for share in shares for s in share] == list(range(shards))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1 and min(map(len, shares)) >= 1


def test_fca_eval_under_torchrun_gives_one_processs_figures(tmp_path):
    """``fca eval`` on two gloo ranks: lm-eval shares the documents between them and rank 0 gathers them, so
    ``downstream.json`` holds one process's figures, every document's value and the paired gap alike."""
    pytest.importorskip("lm_eval")
    written = {}
    for ranks in (1, 2):
        out = tmp_path / f"ranks{ranks}"
        args = ["eval", CHECKPOINTS / "featuregate-s0", "--tasks", "fca_next_line", "--limit", 9, "--out", out]
        result = fca([*args, "--calib", TEXT["calibration"], "--window", 64, "--max-windows", 2], ranks)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("wrote ") == 1  # rank 0 alone reports
        written[ranks] = json.loads((out / "downstream.json").read_text())
    one, two = written[1]["tasks"]["fca_next_line"], written[2]["tasks"]["fca_next_line"]
    assert one["samples"] == two["samples"] == 9
    assert_same_figures({"task": one}, {"task": two}, keys=("task",))
    assert written[1]["calibration"] == written[2]["calibration"]
