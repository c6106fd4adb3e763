#!/usr/bin/env bash
# Set up .venv if needed, then regenerate every paper table and figure: `fca reproduce` runs the notebooks in
# notebooks/ through papermill (Jupyter kernel fca-workbench) on the shipped checkpoints and corpus, on CPU,
# into results/<timestamp>/: executed notebooks, tables as CSV/Markdown/LaTeX, figures as HTML, README.md.
# Arguments go to `fca reproduce` (--config FILE, --out DIR, --overwrite); a lone DIR means --out DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ $# -eq 1 && $1 != -* ]]; then set -- --out "$1"; fi
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads of concurrent jobs
# slowed the audits about 2x (measured); override by setting OMP_WAIT_POLICY yourself.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec .venv/bin/fca reproduce "$@"
