#!/usr/bin/env bash
# GPU run of the runtime: `requant determinism` with the real
# pair (cutlass, triton) on the embedded default, then benchmarks/bench_runtime.py (speed,
# pow2/native ratio, transformers bf16 baseline, determinism counts) on the Qwen3-1.7B- and
# 8B-shaped synthetic checkpoints. Run from the repo root on the GPU machine (one H200):
#
#     source benchmarks/gpu_setup.sh || exit 1
#     OUT=/some/dir REQUANT_COMMIT=<commit> bash benchmarks/gpu_runtime.sh
#
# The synthetic checkpoints are generated first when absent (CKPT_ROOT, default /tmp):
# that takes minutes for 8B and is not part of the benchmark's budget; run the script once
# with STEPS=generate to make them in a separate call if the device time is short.
# STEPS (default "generate tests determinism bench") picks the steps. STEPS="tests fast" runs the
# GPU tests and the fast engine's benchmark (bench_runtime.py --synthetic: random GPU weights, no
# checkpoint; 3 more files under $OUT/fast, so run it without the other steps to stay within 8). Each step has a timeout,
# logs its wall time and exit status to timings.txt and the script goes on after a failure.
# Files in $OUT (8): env.txt, timings.txt, gpu_tests.log, determinism_default.json/.log,
# bench_runtime.json/.md, bench.log.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
CKPT_ROOT="${CKPT_ROOT:-/tmp}"
SIZES="${SIZES-qwen3-1.7b qwen3-8b}"    # unset: both; empty: none
STEPS="${STEPS-generate tests determinism bench}"
BENCH_ARGS="${BENCH_ARGS:-}"            # e.g. "--reps 5" or "--det-new-tokens 64"
TIMINGS="$OUT/timings.txt"
touch "$TIMINGS"

gpu_env triton transformers > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

synthetic_checkpoints  # CKPTS: the synthetic checkpoint of each of $SIZES (made first with STEPS "generate")

if has tests || has determinism || has bench; then
    cutlass_build 400
fi

if has tests; then  # the runtime with the real kernels == the emulated orders, batch invariance on CUDA
    step gpu_tests 300 bash -c "python3 -m pytest -q -m gpu -p no:cacheprovider tests/requant/runtime/test_gpu.py tests/requant/runtime/test_fast_gpu.py > '$OUT/gpu_tests.log' 2>&1; \
        rc=\$?; tail -n 5 '$OUT/gpu_tests.log'; exit \$rc"
fi

if has determinism; then
    step determinism_default 300 bash -c "python3 cli.py determinism --backends cutlass,triton --prompts 8 --new-tokens 64 \
        --json '$OUT/determinism_default.json' > '$OUT/determinism_default.log' 2>&1; rc=\$?; tail -n 3 '$OUT/determinism_default.log'; exit \$rc"
fi

if has bench && [ ${#CKPTS[@]} -gt 0 ]; then
    # shellcheck disable=SC2086
    step bench_runtime 590 bash -c "python3 -m benchmarks.bench_runtime ${CKPTS[*]} --out '$OUT' $BENCH_ARGS > '$OUT/bench.log' 2>&1; rc=\$?; exit \$rc"
    tail -n 60 "$OUT/bench.log"
fi
if has fast; then
    mkdir -p "$OUT/fast"
    # shellcheck disable=SC2086
    step bench_runtime_fast 590 bash -c "python3 -m benchmarks.bench_runtime --synthetic qwen3-1.7b,qwen3-8b --out '$OUT/fast' \
        --reps 5 --reference $BENCH_ARGS > '$OUT/fast/bench.log' 2>&1"
    tail -n 40 "$OUT/fast/bench_runtime_fast.md" 2>/dev/null
fi
cat "$TIMINGS"
