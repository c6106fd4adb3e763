"""What the browser tests share: Debian's Chromium (never a downloaded browser), and the servers they start
(``fca dashboard``, ``jupyter lab``): a subprocess on a free loopback port, polled until it answers, and
always stopped."""

import os
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def require_browser() -> None:
    """Skip the test when Playwright or Chromium is missing (``scripts/setup.sh`` installs both); under CI, fail."""
    try:
        import playwright.sync_api  # noqa: F401  (only whether it is installed)

        missing = (
            None if Path(CHROMIUM).exists() else f"{CHROMIUM} is missing (scripts/setup.sh installs Debian's chromium)"
        )
    except ImportError:
        missing = "the playwright package is not installed (pip install -e .[test])"
    if missing and os.environ.get("CI"):
        pytest.fail(f"browser test cannot run under CI: {missing}")
    if missing:
        pytest.skip(missing)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(command: list[str], probe: str, log_path: Path, what: str, **popen):
    """Run ``command`` (its output to ``log_path``) and yield it once ``probe`` answers 200; the test fails with
    the log when it exits or does not answer within 2 minutes. Terminated on exit (killed after 20 s)."""
    log = open(log_path, "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(probe, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not start:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
