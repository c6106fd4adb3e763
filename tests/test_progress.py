"""Progress bars in a log (issue 37): where standard error is not a terminal (a batch job, CI, a pipe) every bar,
nested ones included, writes whole lines: no carriage return, no cursor escape."""

import re
import subprocess
import sys
import textwrap

from conftest import fca

NESTED = textwrap.dedent(
    """
    import sys
    from fca_workbench.foundation.progress import progress

    outer = progress(range(3), desc="outer", unit="model")
    for model in outer:
        for batch in progress(range(40), desc="inner", leave=False):
            pass
        outer.write(f"done {model}", file=sys.stderr)
    """
)


def assert_plain_lines(log: str) -> list[str]:
    assert "\r" not in log and "\x1b[" not in log, repr(log[-500:])
    return log.splitlines()


def test_nested_bars_write_plain_lines_to_a_pipe():
    result = subprocess.run([sys.executable, "-c", NESTED], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = assert_plain_lines(result.stderr)
    assert [line for line in lines if line.startswith("done")] == ["done 0", "done 1", "done 2"]
    assert sum(bool(re.match(r"inner: 100%.* 40/40 ", line)) for line in lines) == 3  # each inner bar's last state
    assert re.match(r"outer: 100%.* 3/3 ", lines[-1]), lines[-1]


def test_an_audit_logged_to_a_pipe_has_no_cursor_codes(tiny_checkpoints, tmp_path):
    """``fca audit`` shows its capture, replay and per-condition bars (nested) as lines in a captured log."""
    result = fca(
        "audit",
        tiny_checkpoints["featuregate"],
        "--window",
        64,
        "--max-windows",
        4,
        "--batch-size",
        2,
        "--resamples",
        5,
        "--out",
        tmp_path / "audit",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = assert_plain_lines(result.stderr)
    assert any(line.startswith("replay: 100%") for line in lines), lines
