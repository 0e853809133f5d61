#!/usr/bin/env bash
# One GPU call (one H200, no network, <= 9.5 minutes) for the evidence about the embedded
# default and the runtime benchmark of the Qwen3-1.7B-shaped synthetic
# checkpoint. From the repository root, after `source benchmarks/gpu_setup.sh`:
#
#     REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) OUT=/some/dir bash benchmarks/gpu_eval.sh
#
# Steps (each time-limited, timed in timings.txt, run even when an earlier one failed):
#   cutlass_build     the CUTLASS JIT build (a stale lock from a killed build removed first)
#   gpu_tests         tests/requant/runtime/test_gpu.py and the audit's real-pair test
#   convert_pow2      `requant convert` of the default to the nearest (pow2) arm: the bytes a
#                     user would publish; convert is byte-exact, so the same command on any
#                     machine makes the same files and the same manifest digest
#   audit_native      `requant audit` of the default (cutlass,triton) -> audit_native/
#   audit_pow2        `requant audit` of the pow2 conversion -> audit_pow2/ (the card's audit)
#   determinism       `requant determinism` of the default, cutlass,triton, 8 prompts x 64
#   eval              `requant eval` of the default, every arm, --source default-bf16, all 50
#                     held-out chapters, backend triton -> eval/ (JSON, Markdown, PNG)
#   synthetic_1.7b    python -m requant.checkpoint.synthetic qwen3-1.7b (random weights, outliers)
#   bench_runtime     benchmarks/bench_runtime.py on it, with whatever time is left
# Files in $OUT: gpu_eval.log (everything), timings.txt, results.tar.gz (every report).
set -uo pipefail
TOTAL_S=${TOTAL_S:-540}
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
R="$OUT/results"
mkdir -p "$R"
STEP_LOG="$OUT/gpu_eval.log"
TIMINGS="$OUT/timings.txt"
: > "$STEP_LOG"; : > "$TIMINGS"
export REQUANT_CUTLASS_CACHE=${REQUANT_CUTLASS_CACHE:-/tmp/requant_cutlass} MAX_JOBS=${MAX_JOBS:-16}
DEF=requant/data/default
POW2=/tmp/requant-default-nearest
SYN=/tmp/requant-qwen3-1.7b-synthetic

gpu_env triton transformers lm_eval > "$R/env.txt" 2>&1
cat "$R/env.txt" >> "$STEP_LOG"

cutlass_build 240
step gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/requant/runtime/test_gpu.py tests/audit/test_compare.py
step convert_pow2 60 python3 cli.py convert "$DEF" --arm nearest -o "$POW2"
step audit_native 90 python3 cli.py audit "$DEF" --backends cutlass,triton --report "$R/audit_native"
step audit_pow2 90 python3 cli.py audit "$POW2" --backends cutlass,triton --report "$R/audit_pow2"
cp "$POW2/requant-convert.json" "$POW2/SHA256SUMS" "$R/audit_pow2/" 2>/dev/null
step determinism 120 python3 cli.py determinism "$DEF" --backends cutlass,triton --prompts 8 --new-tokens 64 \
    --json "$R/determinism_default.json"
step eval 240 python3 cli.py eval "$DEF" --arms native,nearest,ceiling,mse,probe --source requant/data/default-bf16 \
    --backend triton --bootstrap 2000 --seed 0 --report "$R/eval"
L=$(left)
if [ "$L" -gt 150 ]; then
    step synthetic_1.7b 90 python3 -m requant.checkpoint.synthetic qwen3-1.7b "$SYN"
    L=$(left)
    step bench_runtime $((L - 10)) python3 -m benchmarks.bench_runtime "$SYN" --out "$R/runtime_1.7b" --reps 3
else
    skip synthetic/bench_runtime "only ${L} s left"
fi
cp "$TIMINGS" "$R/"
tar -czf "$OUT/results.tar.gz" -C "$OUT" results
echo "total $(elapsed) s" | tee -a "$TIMINGS"
cat "$TIMINGS"
grep -E "identical|passed|failed|word_perplexity|delta" "$STEP_LOG" | tail -n 40
