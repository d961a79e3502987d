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

# Tests run in one worker process per core (pytest-xdist; TEST_WORKERS=1 runs them in this process): unit tests one
# by one to whichever worker is free (a module's fixtures are then built once per worker), notebooks a file to a
# worker (a notebook's cells share one kernel). Every test and notebook uses one torch thread, so two workers on
# two cores take about half the time. UNIT_ARGS adds pytest arguments to the unit stage (test_portability.sh
# leaves out the tests that compute no floats).
unit_workers=(-n "${TEST_WORKERS:-auto}" --dist load)
notebook_workers=(-n "${TEST_WORKERS:-auto}" --dist loadfile)
[[ "${TEST_WORKERS:-auto}" == 1 ]] && unit_workers=() && notebook_workers=()
timing=(--durations=15)  # the slowest tests of each stage, to keep CI under 25 minutes
# shellcheck disable=SC2206  # UNIT_ARGS is a list of words
unit_args=(${UNIT_ARGS:-})
# Numbers in notebook outputs are compared with a tolerance (tests/nbval_numbers.py), text exactly.
wants unit && stage "unit tests and notebook sync" python -m pytest tests -q -p no:cacheprovider \
    "${unit_workers[@]}" "${timing[@]}" "${unit_args[@]}"
wants notebooks && stage "notebooks (nbval: text exact, numbers within 1e-4)" python -m pytest notebooks -q \
    -p no:cacheprovider -p tests.nbval_numbers "${notebook_workers[@]}" "${timing[@]}" \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600
# The same command as `make test-browser`'s build: after a clean build its stamp is set, so the browser check that
# CI runs next reads this HTML instead of building the book a second time.
strict_build() { jupyter-book build . -W -n --keep-going --quiet && touch _build/.html-stamp; }
wants book && stage "strict book build (-W -n)" strict_build

echo
if ((${#failed[@]})); then
    echo "FAILED stages: ${failed[*]}"
    exit 1
fi
echo "all stages passed"
