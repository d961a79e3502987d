#!/usr/bin/env bash
# The whole test suite, stage by stage, printing how long each stage took. Called by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=()
stage() {
    local name=$1; shift
    echo
    echo "=== stage: $name"
    local start=$SECONDS
    if "$@"; then status=ok; else status=FAILED; failed+=("$name"); fi
    echo "=== stage: $name: $status in $((SECONDS - start)) s"
}

stage "unit tests and notebook sync" python -m pytest tests -q -p no:cacheprovider
stage "notebooks (nbval, strict outputs)" python -m pytest notebooks -q -p no:cacheprovider \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600
stage "strict book build (-W -n)" jupyter-book build . -W -n --keep-going --quiet

echo
if ((${#failed[@]})); then
    echo "FAILED stages: ${failed[*]}"
    exit 1
fi
echo "all stages passed"
