"""The workbench as a user installs it (issue 17): the sdist and wheel built by ``python -m build``, the wheel
installed into a fresh virtualenv, and every command run from a folder outside the checkout.

The virtualenv holds only the wheel; its dependencies are this environment's, reached through a ``.pth``
file (no network, nothing reinstalled), and this checkout is on no path, so every import, notebook, corpus
split and the dashboard app come from the installed wheel.
"""

import email
import hashlib
import io
import json
import os
import re
import runpy
import shutil
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
import venv
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import fca_workbench
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.foundation.resources import copy_checkpoints

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "data" / "checkpoints"
CHECKPOINT = SHIPPED / "featuregate-s0"
MAX_WINDOWS = 4


# A careless user's leftovers beside the committed files: none of them may enter the sdist or the wheel.
STRAYS = {
    "data/checkpoints/featuregate-s0/credentials.json": b'{"hf_token": "hf_secret"}',
    "data/checkpoints/scratch-s9/config.json": b"{}",
    "data/checkpoints/scratch-s9/model.safetensors": b"weights",
    "data/checkpoints/scratch-s9/optimizer.safetensors": b"optimizer state",
    "data/checkpoints/scratch-s9/trainer_state.pt": b"optimizer state",
    "data/corpus/scratch.jsonl.gz": b"not the corpus",
    "notebooks/scratch.ipynb": b"{}",
    "tests/hf_token.txt": b"hf_secret",
    "benchmarks/results/scratch.json": b"{}",
    "docs/drafts/notes.md": b"unpublished",
    "scripts/local.env": b"HF_TOKEN=hf_secret",
}
# links to a file and to a folder outside the tree, named as the globs once shipped them
LINKS = {"data/checkpoints/featuregate-s0/outside.json": "secret.json", "data/checkpoints/linked-s0": "run"}
SECRET = hashlib.sha256(b"outside the tree").hexdigest().encode()  # bytes this source does not spell


def tracked_files() -> list[str]:
    """The checkout's committed files (``git ls-files``), as they stand in the working tree."""
    listed = subprocess.check_output(["git", "-C", str(REPO), "ls-files", "-z"], timeout=60).decode().split("\0")
    return [name for name in listed if name and (REPO / name).is_file()]


def listed_data_files() -> set[str]:
    """The paths package_data.txt names, the one list of the package's data files."""
    lines = (REPO / "package_data.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def in_wheel(name: str) -> str:
    """Where a checkout file lies in the wheel (pyproject's package-dir maps notebooks/ and data/)."""
    top, _, rest = name.partition("/")
    return f"fca_workbench/shipped/{top}/{rest}" if top in ("data", "notebooks", "dashboards") else name


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``python -m build``: the sdist, and the wheel built from that sdist (so the sdist must be complete), from a
    copy of the checkout's tracked files with ``STRAYS`` and ``LINKS`` added, as a working checkout may hold."""
    checkout = tmp_path_factory.mktemp("checkout")
    for name in tracked_files():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, checkout / name, follow_symlinks=False)
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True, timeout=60)
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True, timeout=600)  # the committed files, as a checkout
    for name, payload in STRAYS.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_bytes(payload)
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.json").write_bytes(SECRET)
    (outside / "run").mkdir()
    for name in ("config.json", "model.safetensors", "README.md"):
        (outside / "run" / name).write_bytes(SECRET)
    for name, target in LINKS.items():
        (checkout / name).symlink_to(outside / target)
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(checkout)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return SimpleNamespace(wheel=next(out.glob("*.whl")), sdist=next(out.glob("*.tar.gz")))


def test_wheel_and_sdist_hold_the_listed_files_and_no_stray_or_linked_one(dist):
    """The package's data files are the committed ones package_data.txt names: untracked credentials, a scratch
    run with its optimizer state and links out of the tree stay out of both archives (issue 34)."""
    listed = listed_data_files()
    package_folders = ("fca_workbench/", "notebooks/", "dashboards/", "data/")
    committed = {
        n for n in tracked_files() if n.startswith(package_folders) and (n.startswith("data/") or not n.endswith(".py"))
    }
    assert listed == committed, f"package_data.txt differs from git ls-files: {sorted(listed ^ committed)}"
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        assert not any(SECRET in wheel.read(n) for n in names)
    shipped_data = in_wheel("data/")
    data = {n for n in names if (n.startswith(shipped_data) or not n.endswith(".py")) and ".dist-info/" not in n}
    assert data == {in_wheel(n) for n in listed}, sorted(data ^ {in_wheel(n) for n in listed})
    with tarfile.open(dist.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
        assert not any(m.issym() or m.islnk() for m in members.values())
        assert not any(SECRET in sdist.extractfile(m).read() for m in members.values() if m.isfile())
    strays = set(STRAYS) | set(LINKS) | {"data/checkpoints/linked-s0/config.json"}
    assert not strays & set(members) and not {in_wheel(n) for n in strays} & names
    sdist_data = {n for n, m in members.items() if n.startswith("data/") and not m.isdir()}
    assert sdist_data == {n for n in listed if n.startswith("data/")}


def test_the_build_hook_refuses_a_listed_link_glob_or_missing_file(tmp_path):
    """setup.py's check: a listed path reached through a link, a glob, a path out of the tree or a missing file
    stops the build with its line named."""
    hook = runpy.run_path(str(REPO / "setup.py"), run_name="setup_hook")
    (tmp_path / "data" / "run").mkdir(parents=True)
    (tmp_path / "data" / "run" / "config.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    (tmp_path / "data" / "linked.json").symlink_to(tmp_path / "elsewhere" / "config.json")
    (tmp_path / "data" / "linked-run").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    listing = tmp_path / "package_data.txt"
    listing.write_text("# a comment\n\ndata/run/config.json\n")
    assert hook["listed_data_files"](tmp_path) == ["data/run/config.json"]
    for line, problem in [
        ("data/linked.json", "data/linked.json is a symbolic link"),
        ("data/linked-run/config.json", "data/linked-run is a symbolic link"),
        ("data/run/*.json", "not a plain relative path"),
        ("data/../elsewhere/config.json", "not a plain relative path"),
        ("/etc/hostname", "not a plain relative path"),
        ("data/run/missing.json", "not a file of this checkout"),
        ("data/run", "not a file of this checkout"),
    ]:
        listing.write_text(f"data/run/config.json\n{line}\n")
        with pytest.raises(hook["SetupError"], match=re.escape("package_data.txt:2: ") + ".*" + re.escape(problem)):
            hook["listed_data_files"](tmp_path)


@pytest.fixture(scope="module")
def user(dist, tmp_path_factory):
    """A fresh virtualenv with the wheel installed, and an empty working folder outside the checkout."""
    root = tmp_path_factory.mktemp("user")
    assert REPO not in root.parents
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FCA_CHECKPOINTS", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", JUPYTER_DATA_DIR=str(root / "jupyter"), IPYTHONDIR=str(root / "ipython"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(dist.wheel),
        ],
        check=True,
        timeout=300,
        env=env,
    )
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True, env=env
        ).strip()
    )
    (site / "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = root / "work"
    work.mkdir()
    return SimpleNamespace(venv=env_dir, python=python, site=site, package=site / "fca_workbench", env=env, work=work)


def fca(user, *args, env=None, timeout=600):
    return subprocess.run(
        [str(user.venv / "bin" / "fca"), *map(str, args)],
        cwd=user.work,
        capture_output=True,
        text=True,
        env={**user.env, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def checkpoints(user, dist):
    """``fca data checkpoints --from SDIST --into checkpoints``, run in the working folder."""
    copied = fca(user, "data", "checkpoints", "--from", dist.sdist, "--into", "checkpoints")
    assert copied.returncode == 0, copied.stderr
    return user.work / "checkpoints"


def files_under(folder: Path) -> dict[Path, int]:
    """Every file below ``folder`` with its mtime (bytecode caches aside)."""
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_copy_checkpoints_takes_only_checkpoint_files_and_never_overwrites(tmp_path):
    """Members outside ``<top>/data/checkpoints/`` or climbing out of it with ``..`` are never written."""
    sdist = tmp_path / "fca_workbench-0.1.0.tar.gz"
    members = {
        "fca_workbench-0.1.0/data/checkpoints/m/config.json": b"{}",
        "fca_workbench-0.1.0/data/checkpoints/m/.lock": b"",
        "fca_workbench-0.1.0/data/checkpoints/m/../../../../escaped": b"x",
        "fca_workbench-0.1.0/data/corpus/eval.jsonl.gz": b"y",
    }
    with tarfile.open(sdist, "w:gz") as archive:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    into = tmp_path / "out" / "checkpoints"
    assert copy_checkpoints(sdist, into) == ["m"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "fca_workbench-0.1.0.tar.gz",
        "out/checkpoints/m/config.json",
    ]
    with pytest.raises(UserError, match="not an empty folder"):
        copy_checkpoints(sdist, into)
    with pytest.raises(UserError, match="no data/checkpoints folder"):
        copy_checkpoints(tmp_path / "out", tmp_path / "again")  # a folder, but not a checkout
    assert not (tmp_path / "again").exists() and not list((tmp_path / "out").glob(".*"))


def shipped_checkpoint_files() -> set[str]:
    """Every listed file of every shipped checkpoint, as the wheel names it."""
    return {in_wheel(n) for n in listed_data_files() if n.startswith("data/checkpoints/")}


def shipped_checkpoints() -> set[str]:
    """The names of the shipped checkpoints (the folders package_data.txt lists files of)."""
    return {n.split("/")[2] for n in listed_data_files() if n.startswith("data/checkpoints/")}


def test_wheel_carries_the_shipped_files_and_the_checkpoints(dist):
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    expected = {f"fca_workbench/shipped/notebooks/{p.name}" for p in (REPO / "notebooks").glob("*.py")}
    expected |= {f"fca_workbench/shipped/dashboards/{p.name}" for p in (REPO / "dashboards").glob("*.py")}
    expected |= {
        f"fca_workbench/shipped/data/{p.relative_to(REPO / 'data')}"
        for folder in ("corpus", "tokenizer", "configs", "tasks")  # tasks: fca eval's shipped task
        for p in (REPO / "data" / folder).iterdir()
        if p.is_file()  # not the __pycache__ lm-eval leaves beside a task's local_files.py
    }
    expected |= {
        f"fca_workbench/shipped/data/{p.relative_to(REPO / 'data')}"  # notebook 07's logs
        for p in (REPO / "data" / "training_dynamics").rglob("*")
        if p.is_file()
    }
    # every module of the package, subpackages included (a subpackage missing from pyproject's list is not)
    expected |= {p.relative_to(REPO).as_posix() for p in (REPO / "fca_workbench").rglob("*.py")}
    expected.add("fca_workbench/py.typed")  # the package's annotations are for its users' type checkers too
    assert len(expected) >= 6 + 2 + 3 + 2 and expected <= names, sorted(expected - names)
    checkpoint_files = shipped_checkpoint_files()
    assert {n.split("/")[4] for n in checkpoint_files} == shipped_checkpoints() and len(shipped_checkpoints()) >= 10
    assert checkpoint_files <= names, sorted(checkpoint_files - names)
    assert {n for n in names if "/checkpoints/" in n} == checkpoint_files  # no lock file, no optimizer state
    for name in checkpoint_files:  # byte for byte the checkout's
        assert zipfile.ZipFile(dist.wheel).read(name) == (REPO / "data" / name.split("shipped/data/")[1]).read_bytes()
    assert dist.wheel.stat().st_size < 64 * 2**20

    metadata = email.message_from_bytes(
        zipfile.ZipFile(dist.wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    )
    assert metadata["Version"] == fca_workbench.__version__ and metadata["License-Expression"] == "MIT"
    assert metadata.get_all("Project-URL") and len(metadata.get_all("Classifier")) >= 5
    assert {"notebooks", "test", "dev", "docs", "bench", "eval"} <= set(metadata.get_all("Provides-Extra"))
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    with tarfile.open(dist.sdist) as sdist:
        weights = {Path(n).parent.name for n in sdist.getnames() if n.endswith("model.safetensors")}
    assert weights == shipped_checkpoints()


def test_wheel_carries_the_controller_design_study_and_reads_it_from_there(dist, user):
    """Notebook 09's data: every committed file of ``data/controller_design`` is in the wheel, and the installed
    package reads the study from its bundled copy."""
    study = REPO / "data" / "controller_design"
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    committed = {f"fca_workbench/shipped/data/{p.relative_to(REPO / 'data')}" for p in study.rglob("*") if p.is_file()}
    assert "fca_workbench/shipped/data/controller_design/default-s0/audit_summary.json" in committed
    assert committed <= names, sorted(committed - names)
    read = subprocess.run(
        [
            str(user.python),
            "-c",
            "from fca_workbench.notebooks.tables import read_design_study as r; s = r(); print(s.folder, len(s.runs))",
        ],
        cwd=user.work,
        capture_output=True,
        text=True,
        env=user.env,
        timeout=300,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    runs = len(list(study.glob("*/audit_summary.json")))
    assert read.stdout.split() == [str(user.package / "shipped" / "data" / "controller_design"), str(runs)]


def test_installed_audit_reads_the_bundled_corpus(user):
    result = fca(user, "audit", CHECKPOINT, "--max-windows", MAX_WINDOWS)
    assert result.returncode == 0, result.stderr[-3000:]
    audit = json.loads((user.work / "results" / "audit-featuregate-s0" / "audit.json").read_text())
    tokenizer = load_tokenizer()
    for split in ("eval", "calibration"):
        source = Path(audit["data"][split]["source"])
        assert source == user.package / "shipped" / "data" / "corpus" / f"{split}.jsonl.gz"
        # the same windows as the checkout's own split, tokenized here by the checkout's code
        expected = fingerprint_tensor(load_windows(split_path(split), tokenizer, 256, MAX_WINDOWS))
        assert audit["data"][split]["fingerprint"] == expected


def test_installed_package_finds_and_loads_its_own_checkpoints(user):
    """``checkpoints_dir()`` of the installed wheel is its own ``shipped/data/checkpoints``, offline, and a
    shipped checkpoint loads from there with the weights of the checkout's."""
    script = (
        "import json; from fca_workbench.foundation.resources import checkpoints_dir; "
        "from fca_workbench.adapters.controlled import load_controlled; "
        "model = load_controlled(checkpoints_dir() / 'featuregate-s0'); "
        "print(json.dumps([str(checkpoints_dir()), model.arch, sum(p.numel() for p in model.parameters())]))"
    )
    found = subprocess.run(
        [str(user.python), "-c", script],
        cwd=user.work,
        capture_output=True,
        text=True,
        env={**user.env, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    folder, arch, params = json.loads(found.stdout.strip().splitlines()[-1])
    assert Path(folder) == user.package / "shipped" / "data" / "checkpoints" and arch == "featuregate"
    from fca_workbench.adapters.controlled import load_controlled

    assert params == sum(p.numel() for p in load_controlled(CHECKPOINT).parameters())
    copied = fca(user, "data", "checkpoints", "--into", "elsewhere")  # no --from: the installed package's own
    assert copied.returncode == 0, copied.stderr
    assert {p.name for p in (user.work / "elsewhere").iterdir()} == shipped_checkpoints()


def test_data_checkpoints_copies_them_out_of_the_sdist(checkpoints):
    assert {p.name for p in checkpoints.iterdir()} == shipped_checkpoints()
    copied = {
        f"data/checkpoints/{p.relative_to(checkpoints).as_posix()}" for p in checkpoints.rglob("*") if p.is_file()
    }
    assert copied == {n for n in listed_data_files() if n.startswith("data/checkpoints/")}
    for name in copied:
        assert (checkpoints / name.removeprefix("data/checkpoints/")).read_bytes() == (REPO / name).read_bytes(), name


def test_installed_reproduce_runs_the_bundled_notebook_with_its_own_kernel(user):
    """``fca reproduce`` from the wheel alone: its bundled notebook, kernel and checkpoint (no checkout)."""
    before = files_under(user.venv)
    bundled = user.package / "shipped" / "data" / "checkpoints" / CHECKPOINT.name
    (user.work / "reproduce.toml").write_text(
        f'notebooks = ["01_variation"]\n[parameters]\ncheckpoints = ["{bundled}"]\nmax_windows = {MAX_WINDOWS}\n'
    )
    result = fca(user, "reproduce", "--config", "reproduce.toml")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "passed  01_variation" in result.stdout
    (out,) = (p for p in (user.work / "results").iterdir() if p.name not in ("cache", "audit-featuregate-s0"))
    assert (out / "tables" / "variation_per_model.csv").is_file()
    assert (out / "notebooks" / "01_variation.ipynb").is_file() and (user.work / "results" / "cache").is_dir()

    kernel = json.loads((user.venv / "share" / "jupyter" / "kernels" / "fca-workbench" / "kernel.json").read_text())
    assert kernel["argv"][0] == str(user.python)  # registered for the installed interpreter, in sys.prefix
    after = files_under(user.venv)
    written = {p for p in after if before.get(p) != after[p]}
    assert {p.relative_to(user.venv).parts[:4] for p in written} == {("share", "jupyter", "kernels", "fca-workbench")}


def test_installed_dashboard_serves_the_bundled_app_and_checkpoints(user):
    before = files_under(user.package)
    port = free_port()
    server = subprocess.Popen(
        [str(user.venv / "bin" / "fca"), "dashboard", "--port", str(port)],
        cwd=user.work,
        env=user.env,  # no FCA_CHECKPOINTS: the wheel's own checkpoints
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        page = http_get(f"http://127.0.0.1:{port}/", server, timeout=180)
    finally:
        server.terminate()
        log, _ = server.communicate(timeout=30)
    assert page is not None, log[-3000:]
    assert "FCA dashboard" in page
    assert files_under(user.package) == before  # nothing written inside site-packages


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, server: subprocess.Popen, timeout: float) -> str | None:
    """The page once the server answers 200; None if it exits or the time runs out first."""
    deadline = time.monotonic() + timeout
    while server.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                if response.status == 200:
                    return response.read().decode()
        except OSError:
            time.sleep(0.5)
    return None
