#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite on two pytest-xdist workers (the reference machine has
# two cores), one thread each; every test module stays whole on one worker (tests/conftest.py groups them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -q -n 2 "$@"
