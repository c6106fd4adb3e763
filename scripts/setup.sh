#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install the workbench into it.
# The CPU torch wheel goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
# A machine that already has a torch in .venv (a GPU user's, say) keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[test]"
