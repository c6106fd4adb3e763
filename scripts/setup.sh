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
.venv/bin/python -m pip install --quiet -e ".[test,dev,docs]"  # [test] includes [notebooks]
# The named Jupyter kernel `fca reproduce` (papermill's kernel_name) and JupyterLab use: this venv's Python,
# registered inside the venv itself, so every clone has its own and none shadows another.
.venv/bin/python -m ipykernel install --prefix "$PWD/.venv" --name fca-workbench \
    --display-name "Python (fca-workbench)" >/dev/null

# The dashboard's browser test drives Debian's Chromium through Playwright (never `playwright install`, which
# downloads a browser build of its own), and plotly's exporter (kaleido) draws the PDF, SVG and PNG figures with
# it; poppler-utils' pdftoppm lets the figure test look inside a PDF. Installed only when missing;
# FCA_SKIP_BROWSER=1 skips them.
if [[ (! -x /usr/bin/chromium || ! -x /usr/bin/pdftoppm) && "${FCA_SKIP_BROWSER:-0}" != 1 ]]; then
    if [[ $(id -u) == 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium poppler-utils >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium poppler-utils >/dev/null
    else
        echo "setup: /usr/bin/chromium or pdftoppm is missing and apt-get needs root: the browser and figure tests will be skipped" >&2
    fi
fi
