#!/usr/bin/env bash
# One GPU call (one H200, <= 9.5 minutes) on the merged tree: every GPU test, the runtime's users
# timed with each engine (requant eval and requant determinism, --engine reference vs fast; the
# audit, whose capture runs the reference engine), and requant tp-check with the real kernels on
# the one GPU (ranks share it; collectives through gloo). From the repository root:
#
#     OUT=/some/dir REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) bash benchmarks/gpu_engines.sh
#
# STEPS (default "build tests users audit tp") picks the steps; TESTS (default: tests) the
# pytest paths of the tests step; ENGINES (default "reference fast") the engines of the users step.
# Files in $OUT: env.txt, timings.txt, gpu_tests.log, results.tgz (every JSON and log below).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
source benchmarks/gpu_setup.sh || exit 1
STEP_DIR="$OUT/res"  # every step's output: res/NAME.log
RES="$STEP_DIR"
mkdir -p "$RES"
STEPS="${STEPS:-build tests users audit tp}"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
{
    gpu_env triton transformers setuptools
    python3 -c "import requant, requant.kernels; print(requant.__file__, requant.kernels.__file__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

has build && cutlass_build 240
if has tests; then
    # shellcheck disable=SC2086
    step gpu_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests}
    cp "$RES/gpu_tests.log" "$OUT/gpu_tests.log"
fi

has users && for engine in ${ENGINES:-reference fast}; do
    step "eval_$engine" 150 requant eval --engine "$engine" --backend triton --source requant/data/default-bf16 \
        --json "$RES/eval_$engine.json"
    step "determinism_$engine" 120 requant determinism --engine "$engine" --backends cutlass,triton \
        --json "$RES/determinism_$engine.json"
done
has audit && step audit 120 requant audit --backends cutlass,triton --json "$RES/audit.json"

has tp && for be in cutlass triton; do
    for regime in native pow2; do
        step "tp_${be}_${regime}" 120 requant tp-check --device cuda --comm gloo --tp 1,2,4 --backend "$be" \
            --regime "$regime" --new-tokens 16 --prompts 4 --json "$RES/tp_${be}_${regime}.json"
    done
done
has tp && step tp_cutlass_bf16 120 requant tp-check --device cuda --comm gloo --tp 1,2,4 --backend cutlass --reduce bf16 \
    --new-tokens 16 --prompts 4 --json "$RES/tp_cutlass_bf16.json"

tar czf "$OUT/results.tgz" -C "$OUT" res && rm -rf "$RES"
cat "$TIMINGS"
