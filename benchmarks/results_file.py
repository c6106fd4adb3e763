"""Where the benchmark scripts put what they measured: ``benchmarks/results/<name>.json`` (every figure) and
``<name>.md`` (the table a reader looks at), each written to a temporary name then renamed."""

import json
from pathlib import Path

from fca_workbench.foundation.files import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, results: dict, markdown: str) -> None:
    """Write ``results`` as ``<name>.json`` and ``markdown`` as ``<name>.md``, and print the Markdown."""
    write_atomic(RESULTS / f"{name}.json", (json.dumps(results, indent=2) + "\n").encode())
    write_atomic(RESULTS / f"{name}.md", markdown.encode())
    print(markdown)
