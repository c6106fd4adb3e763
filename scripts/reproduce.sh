#!/usr/bin/env bash
# Set up .venv if needed, then audit the shipped checkpoints on the shipped corpus (CPU):
# the seven FeatureGate seeds aggregated as mean ± sd, then MUDDPythia-tiny and the Dense baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=${1:-results/reproduce}
.venv/bin/fca audit-many data/checkpoints/featuregate-s{0..6} --out "$out/featuregate"
.venv/bin/fca audit data/checkpoints/muddpythia-s0 --out "$out/muddpythia-s0"
.venv/bin/fca audit data/checkpoints/dense-s0 --out "$out/dense-s0"
