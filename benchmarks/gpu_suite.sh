#!/usr/bin/env bash
# The GPU test suite (`pytest -m gpu tests`) in collection order, then in reversed order, from the
# repository root on the GPU machine:
#
#     OUT=/some/dir REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) bash benchmarks/gpu_suite.sh
#
# ORDERS (default "forward reversed") picks the passes; PARALLEL=1 runs them at once, as two pytest
# processes on the one GPU (16 host cores; the suite has no timed test and every temporary path and
# port is per process), so both orders fit one 10-minute call with the build. Without it, one call
# of 600 s may not hold both: ORDERS=forward, then ORDERS=reversed in a second call while the machine
# is warm. LIMIT_S (default 300) is each pass's limit
# (the suite took 243 s in collection order at c23ab4e; the CUTLASS build before it 60-90 s). Each
# pass is verbose (one line per test, so a pass cut by its limit still says where it stopped) and
# ends with the 40 slowest tests. Files in $OUT: env.txt, timings.txt, suite_forward.log,
# suite_reversed.log.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
if ls .whl/*.whl > /dev/null 2>&1; then  # wheels carried: install them and this checkout
    source benchmarks/gpu_setup.sh || exit 1
fi
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
gpu_env triton transformers lm_eval > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
cutlass_build 300
STEP_DIR="$OUT"
for order in ${ORDERS:-forward reversed}; do
    plugin=()
    [ "$order" = reversed ] && plugin=(-p benchmarks._reverse_order)
    if [ "${PARALLEL:-0}" = 1 ]; then
        step "suite_$order" "${LIMIT_S:-300}" python3 -m pytest -v -m gpu -p no:cacheprovider "${plugin[@]}" \
            --durations=40 tests &
    else
        step "suite_$order" "${LIMIT_S:-300}" python3 -m pytest -v -m gpu -p no:cacheprovider "${plugin[@]}" \
            --durations=40 tests
    fi
done
wait
for order in ${ORDERS:-forward reversed}; do
    tail -n 3 "$OUT/suite_$order.log"
done
