"""No request nobody asked for: a command on a local folder sends nothing to any host. The hub endpoint and the
proxies point at a logger on 127.0.0.1, which must see no request at all (the kernels package's publisher
checks, run when transformers imports a modelling module, and huggingface_hub's registry fetch would reach it)."""

import contextlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from fca_workbench.data.corpus import DATA_DIR
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.foundation.checkpoint import NO_REQUESTS

COMMAND_SECONDS = 300


@contextlib.contextmanager
def request_logger() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 answering every request (a proxy's CONNECT too) with 502, and the requests it saw."""
    seen: list[str] = []

    class Logged(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_POST = do_PUT = do_CONNECT = answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Logged)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def logged_environment(url: str) -> dict:
    """This process's environment with the hub and every proxy at ``url``, and nothing that turns requests off."""
    dropped = {*NO_REQUESTS, "TRANSFORMERS_OFFLINE", "NO_PROXY", "no_proxy"}
    environment = {name: value for name, value in os.environ.items() if name not in dropped}
    proxies = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}
    return {**environment, **proxies, "HF_ENDPOINT": url, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def gpt_neo(tmp_path_factory):
    """A tiny transformers gpt_neo folder: a family the workbench does not ship."""
    from zoo import build_any, save

    return save(build_any("gpt_neo"), tmp_path_factory.mktemp("foreign") / "gpt_neo", load_tokenizer())


def fca_logged(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``fca ARGS`` with the hub and every proxy at a fresh logger: its result and the requests the logger saw."""
    with request_logger() as (url, seen):
        result = subprocess.run(
            [sys.executable, "-m", "fca_workbench", *args],
            capture_output=True,
            text=True,
            env=logged_environment(url),
            timeout=COMMAND_SECONDS,
        )
    return result, seen


def assert_no_request(result: subprocess.CompletedProcess, seen: list[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert seen == []
    assert "offline mode" not in result.stderr  # the kernels package's note on each kernel transformers looks for


@pytest.mark.parametrize("which", ["shipped", "foreign"])
def test_an_audit_of_a_local_folder_sends_no_request(which, gpt_neo, tmp_path):
    folder = DATA_DIR / "checkpoints" / "moe-s0" if which == "shipped" else gpt_neo
    audit = ["audit", str(folder), "--max-windows", "2", "--batch-size", "2", "--out", str(tmp_path / "audit")]
    assert_no_request(*fca_logged(*audit))


def test_an_export_of_a_local_folder_sends_no_request(tmp_path):
    folder = DATA_DIR / "checkpoints" / "featuregate-s0"
    export = ["export", str(folder), "--profile", "layer_mean", "--max-windows", "2", "--out", str(tmp_path / "e")]
    assert_no_request(*fca_logged(*export))


def test_an_eval_of_a_local_folder_on_a_shipped_task_sends_no_request(tmp_path):
    folder = DATA_DIR / "checkpoints" / "featuregate-s0"
    args = ["eval", str(folder), "--tasks", "fca_next_line", "--limit", "2", "--max-windows", "2"]
    assert_no_request(*fca_logged(*args, "--out", str(tmp_path / "eval")))


def test_training_from_a_local_folder_sends_no_request(gpt_neo, tmp_path):
    args = ["train", "--init", str(gpt_neo), "--steps", "2", "--warmup", "1", "--window", "16", "--batch-size", "2"]
    assert_no_request(*fca_logged(*args, "--out", str(tmp_path / "tuned")))
