#!/usr/bin/env bash
# Mutation testing with mutmut: every small deliberate bug in interventions, metrics, capture and replay
# must make a test fail. The configuration is [tool.mutmut] in pyproject.toml (modules mutated, the fast
# test files run). Slow (about half an hour on 2 cores), so it is not part of CI.
#
#   scripts/mutation.sh                         # every configured module
#   scripts/mutation.sh interventions metrics   # only these modules of fca_workbench
#
# Mutants are built under mutants/ and results are kept there, so a rerun only retests what changed.
# It ends with the surviving mutants; `.venv/bin/mutmut show NAME` prints one as a diff.
# Record the counts and explain each survivor that stays in benchmarks/results/mutation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mutmut ] || .venv/bin/pip install -q -e '.[mutation]'
names=()
for module in "$@"; do names+=("fca_workbench.${module%.py}.*"); done
export OMP_NUM_THREADS=1
.venv/bin/mutmut run --max-children "${MUTATION_JOBS:-2}" "${names[@]}"
echo
echo "survivors (and mutants not killed for another reason):"
.venv/bin/mutmut results
