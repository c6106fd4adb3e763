#!/usr/bin/env bash
# MUDDPythia at the official 1.4B size on one GPU: build in bf16, save in the official Hugging Face
# layout, load back through load_model, capture + correct/cross_input/token_shuffle replay on 2048-token
# windows; prints tokens/s and peak GPU memory, exits non-zero if a check fails. See gpu_check.py.
# Then the same shape audited by `fca audit` in one process and under `torchrun --nproc-per-node 1` (NCCL;
# every GPU too when there are several): windows/s, figures equal within 1e-6. See bench_distributed.py.
#
#   benchmarks/gpu_check.sh                      # on a CUDA machine (a few minutes on an H200)
#   benchmarks/gpu_check.sh --tiny               # small config on the CPU (gloo), to test the script anywhere
#   benchmarks/gpu_check.sh --json out/gpu.json  # also write the figures of the first step as JSON
#
# Between the two: the audit's overheads at real shapes (MUDDPythia-1.4B, 2-layer Mixtral / OLMoE / Mamba slices)
# on the GPU, merged into benchmarks/results/real_shapes.{json,md}. See bench_real_shapes.py.
#
# Hard limits (GPU_CHECK_TIMEOUT, default 330 s, and DIST_CHECK_TIMEOUT, default 240 s; the shapes step gets
# SHAPES_CHECK_TIMEOUT, default 150 s, or what is left of the 10 minutes once the last step's limit is kept
# back) keep it under 10 minutes whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout "${GPU_CHECK_TIMEOUT:-330}" "$PYTHON" benchmarks/gpu_check.py "$@"
tiny=()
for arg in "$@"; do if [[ "$arg" == --tiny ]]; then tiny=(--tiny); fi; done
shapes_limit=$((600 - ${DIST_CHECK_TIMEOUT:-240} - SECONDS - 10))
shapes_limit=$((shapes_limit < ${SHAPES_CHECK_TIMEOUT:-150} ? shapes_limit : ${SHAPES_CHECK_TIMEOUT:-150}))
if [[ ${#tiny[@]} -gt 0 ]]; then
    shapes=(--tiny --out "$(mktemp -d)")  # the CPU: tests the step, keeps the measured results
else
    shapes=(--device cuda)
fi
if ((shapes_limit > 0)); then  # a benchmark, not a check: its failure is reported and the last step still runs
    timeout "$shapes_limit" "$PYTHON" benchmarks/bench_real_shapes.py "${shapes[@]}" ||
        echo "gpu_check.sh: bench_real_shapes.py exited $?; the shapes it finished are in its results" >&2
fi
exec timeout "${DIST_CHECK_TIMEOUT:-240}" "$PYTHON" benchmarks/bench_distributed.py --gpu --windows 16 ${tiny[@]+"${tiny[@]}"}
