#!/usr/bin/env bash
# Run the unit tests and the notebook checks under other CPU kernels, to catch checks that pass on this CPU only.
# Different CPUs run different float kernels and round differently; these variables, read when torch and numpy
# load, make one x86 machine pick the kernels another CPU would (no second machine needed):
#   ATEN_CPU_CAPABILITY      torch's own kernels: default|avx2|avx512 (log_softmax, attention, AdamW; default
#                            also matmul)
#   MKL_ENABLE_INSTRUCTIONS  the highest instruction set MKL dispatches to: SSE4_2|AVX2|AVX512 (exp, float32 matmul)
#   MKL_CBWR                 fixes MKL's code branch instead (and overrides MKL_ENABLE_INSTRUCTIONS): COMPATIBLE is
#                            its plain SSE2 path, which some readers' CPUs take; on it the rounding of a matmul row
#                            can depend on the other rows of its batch, so a check that rows are bit-exactly
#                            independent of each other fails there
#   OPENBLAS_CORETYPE        OpenBLAS's kernels (numpy's dot products): Prescott|Nehalem|Haswell|Zen|SkylakeX
# Usage: scripts/test_portability.sh [SETTING ...]   settings: native avx2 sse42 default (default: all four)
# "default" is torch's portable, non-vectorised kernels (what CPUs without AVX2 run, and the nearest stand-in here
# for an ARM machine's NEON kernels), with MKL's compatible path and OpenBLAS's kernels of an old CPU: the setting
# most unlike this machine, and the one CI reruns.
# Called by `make test-portability`.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A SETTINGS=(
    [native]=""
    [avx2]="ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell"
    [sse42]="MKL_ENABLE_INSTRUCTIONS=SSE4_2 OPENBLAS_CORETYPE=Zen"
    [default]="ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OPENBLAS_CORETYPE=Prescott"
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
