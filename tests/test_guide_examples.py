"""The Python guide's two runnable examples ("Your own condition", "A model in memory"), run verbatim from the page
in a scratch folder that sees the checkout's ``data/``, each in a fresh interpreter as a reader would run it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "python.md"


def example(section: str) -> str:
    """The first ``python`` code block under the heading ``## section``."""
    text = GUIDE.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", body, re.S)
    assert found, f"no python example under '## {section}'"
    return found.group(1)


def run(code: str, folder: Path) -> str:
    (folder / "data").symlink_to(ROOT / "data")
    result = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_your_own_condition(tmp_path):
    printed = run(example("Your own condition"), tmp_path)
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.split()}
    assert "reversed_positions" in rows and "half_layer_mean" in rows  # in the printed condition table
    assert "ret. half_layer_mean" in printed
    audit = (tmp_path / "my-audits" / "featuregate" / "audit.json").read_text()
    assert '"reversed_positions"' in audit and '"half_layer_mean"' in audit


def test_a_model_in_memory(tmp_path):
    printed = run(example("A model in memory"), tmp_path)
    path, delta = printed.split()
    assert path == "memory:moe-s0" and float(delta) > 0.1  # the trained MoE's routing matters (about +1.5 nats)
    assert (tmp_path / "my-audits" / "moe-in-memory" / "audit.json").is_file()
