#!/usr/bin/env bash
# Set up .venv if needed; check lint, formatting, types, declared dependencies and the documentation site (any failure fails the run);
# then run the whole test suite on two pytest-xdist workers (the reference machine has two cores), one thread
# each; every test module stays whole on one worker (tests/conftest.py groups them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy  # [tool.mypy] in pyproject.toml; warm from .mypy_cache after the first run
.venv/bin/deptry fca_workbench dashboards benchmarks studies notebooks data tests  # [tool.deptry]
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -q -n 2 "$@"
