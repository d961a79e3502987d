#!/usr/bin/env bash
# Run the unit tests and the notebook checks under other CPU kernels, to catch checks that pass on this CPU only.
# Different CPUs run different float kernels and round differently; these variables make one machine pick the
# kernels another CPU would (see ../shared/reference/toolchain.md):
#   ATEN_CPU_CAPABILITY      torch's own kernels (log_softmax, attention, AdamW)
#   MKL_ENABLE_INSTRUCTIONS  MKL's (exp, float32 matmul)
#   OPENBLAS_CORETYPE        OpenBLAS's (numpy's dot products)
# Usage: scripts/test_portability.sh [SETTING ...]   settings: native avx2 sse42 default (default: all four)
# "default" is torch's portable, non-vectorised kernels (what CPUs without AVX2 run, and the nearest stand-in here
# for an ARM machine's NEON kernels), with the MKL and OpenBLAS choices of an older CPU: the setting most unlike
# this machine, and the one CI reruns.
# Called by `make test-portability`.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A SETTINGS=(
    [native]=""
    [avx2]="ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell"
    [sse42]="MKL_ENABLE_INSTRUCTIONS=SSE4_2 OPENBLAS_CORETYPE=Zen"
    [default]="ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 OPENBLAS_CORETYPE=Nehalem"
)
names=("$@")
((${#names[@]})) || names=(native avx2 sse42 default)

# Tests that compute no floats are the same under every kernel; they run once, in `make test`: the student
# edition (the chapters' code, which nbval runs here anyway, with stubs for the exercises), the reader copy, and
# the checks of the book's text and of its sync with the notebooks.
export UNIT_ARGS="--ignore=tests/test_student.py --ignore=tests/test_reader_notebooks.py \
--ignore=tests/test_book_text.py --ignore=tests/test_book_sync.py"

failed=()
for name in "${names[@]}"; do
    [[ -v SETTINGS[$name] ]] || { echo "unknown setting '$name'; choose from: ${!SETTINGS[*]}"; exit 2; }
    echo
    echo "##### kernels: $name (${SETTINGS[$name]:-the kernels this CPU picks})"
    # shellcheck disable=SC2086  # the setting is a list of VAR=value words
    if ! env ${SETTINGS[$name]} bash scripts/run_tests.sh unit notebooks; then failed+=("$name"); fi
done
echo
if ((${#failed[@]})); then
    echo "FAILED under kernels: ${failed[*]}"
    exit 1
fi
echo "all kernel settings passed: ${names[*]}"
