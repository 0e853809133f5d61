#!/usr/bin/env bash
# One GPU call (one H200, <= 9.5 minutes) for what serves: every GPU test on the merged tree (the
# split-KV attention, the replay of a CUTLASS record with Triton in a batch of 17, the device
# sampler == the CPU one), the audit with its decode phase at the Qwen3-1.7B shape with the real
# pair, the seeded sampler's cost per decode step, and batch-1 decode at long contexts. From the
# repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_decode.sh
#
# STEPS (default "build tests audit sampling decode") picks the steps; TESTS (default: tests) the
# pytest paths; REQUANT_WHEELS (gpu_setup.sh) a smaller folder of wheels (nvidia-cutlass alone: the
# lm-eval tests then skip). Files in $OUT: env.txt, timings.txt, gpu_tests.log, results.tgz (JSON and logs).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
source benchmarks/gpu_setup.sh || exit 1
STEP_DIR="$OUT/res"
RES="$STEP_DIR"
mkdir -p "$RES"
STEPS="${STEPS:-build tests audit sampling decode}"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
gpu_env triton transformers > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

has build && cutlass_build 240
if has tests; then
    # shellcheck disable=SC2086
    step gpu_tests 330 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${TESTS:-tests}
    cp "$RES/gpu_tests.log" "$OUT/gpu_tests.log"
fi
SYN=/tmp/requant-qwen3-1.7b-synthetic
if has audit; then
    [ -f "$SYN/config.json" ] || step synthetic_1.7b 120 python3 -m requant.checkpoint.synthetic qwen3-1.7b "$SYN"
    step audit_1.7b 200 requant audit "$SYN" --backends cutlass,triton --byte-tokens --json "$RES/audit_qwen3-1.7b.json"
fi
has sampling && step bench_sampling 120 python3 -m benchmarks.bench_sampling --devices cuda,cpu --out "$RES/sampling"
has decode && step long_context 300 python3 -m benchmarks.bench_long_context --synthetic qwen3-8b --backend triton \
    --reps 3 --out "$RES/long_context"
tar -czf "$OUT/results.tgz" -C "$RES" .
