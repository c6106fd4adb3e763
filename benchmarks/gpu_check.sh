#!/usr/bin/env bash
# MUDDPythia at the official 1.4B size on one GPU: build in bf16, save in the official Hugging Face
# layout, load back through load_model, capture + correct/cross_input/token_shuffle replay on 2048-token
# windows; prints tokens/s and peak GPU memory, exits non-zero if a check fails. See gpu_check.py.
#
#   benchmarks/gpu_check.sh                      # on a CUDA machine (about a minute or two on an H200)
#   benchmarks/gpu_check.sh --tiny               # small config on the CPU, to test the script anywhere
#   benchmarks/gpu_check.sh --json out/gpu.json  # also write the figures as JSON
#
# A hard limit (GPU_CHECK_TIMEOUT seconds, default 470) keeps it under 8 minutes whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec timeout "${GPU_CHECK_TIMEOUT:-470}" "$PYTHON" benchmarks/gpu_check.py "$@"
