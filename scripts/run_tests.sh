#!/usr/bin/env bash
# The whole test suite, stage by stage, printing how long each stage took. Called by `make test`.
# Usage: scripts/run_tests.sh [unit] [notebooks] [book]   (no argument: all three stages)
set -euo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
((${#stages[@]})) || stages=(unit notebooks book)
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }

failed=()
stage() {
    local name=$1; shift
    echo
    echo "=== stage: $name"
    local start=$SECONDS
    if "$@"; then status=ok; else status=FAILED; failed+=("$name"); fi
    echo "=== stage: $name: $status in $((SECONDS - start)) s"
}

# Tests run in one worker process per core (pytest-xdist; TEST_WORKERS=1 runs them in this process), a file's tests
# in one worker: a notebook's cells share one kernel, and a module's fixtures are built once. Every test and
# notebook uses one torch thread, so two workers on two cores take about half the time.
workers=(-n "${TEST_WORKERS:-auto}" --dist loadfile)
timing=(--durations=15)  # the slowest tests of each stage, to keep CI under 25 minutes
[[ "${TEST_WORKERS:-auto}" == 1 ]] && workers=()
# Numbers in notebook outputs are compared with a tolerance (tests/nbval_numbers.py), text exactly.
wants unit && stage "unit tests and notebook sync" python -m pytest tests -q -p no:cacheprovider "${workers[@]}" "${timing[@]}"
wants notebooks && stage "notebooks (nbval: text exact, numbers within 1e-4)" python -m pytest notebooks -q \
    -p no:cacheprovider -p tests.nbval_numbers "${workers[@]}" "${timing[@]}" \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600
wants book && stage "strict book build (-W -n)" jupyter-book build . -W -n --keep-going --quiet

echo
if ((${#failed[@]})); then
    echo "FAILED stages: ${failed[*]}"
    exit 1
fi
echo "all stages passed"
