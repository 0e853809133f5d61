#!/usr/bin/env bash
# One GPU call (one H200) for the portable arithmetic: its GPU tests (the compiled kernels against the
# CPU specification, GPU-made records replayed on the CPU and back), generation records to commit under
# tests/data/gpu_records (the embedded default and a tiny synthetic, CUTLASS and Triton, pow2 and
# native, batch 1 and 4, greedy and seeded), records of a Qwen3-1.7B-shaped synthetic replayed on the
# host CPU with 2 threads (the seconds per token), and the price against the fast engine at the 8B
# shape (prefill 1 x 2048 / 1 x 8192, decode batch 1 / 64). From the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_portable.sh
#
# The whole script takes more than one 10-minute call: run it as three,
#     STEPS="build tests" ...;  STEPS="build records replay17" ...;  STEPS="bench" ...
# (the same $OUT; build is fast once the CUTLASS cache exists).
# STEPS (default "build tests records replay17 bench") picks the steps. Files in $OUT: env.txt,
# timings.txt, res/*.log, records/ (copy its contents to tests/data/gpu_records/), bench/bench_portable.{json,md}.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
source benchmarks/gpu_setup.sh || exit 1
STEP_DIR="$OUT/res"
mkdir -p "$STEP_DIR" "$OUT/records"
STEPS="${STEPS:-build tests records replay17 bench}"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
REC="$OUT/records"

prompts() {  # prompts FILE N [byte]: the first N of four requests, greedy and seeded
    python3 - "$1" "$2" <<'PY'
import json, sys
rows = [{"prompt": "To bake bread,"},
        {"prompt": "The sea was", "temperature": 0.8, "top_p": 0.95, "seed": 7},
        {"prompt": "Once upon a time", "temperature": 1.0, "top_k": 40, "seed": 8},
        {"prompt": "In 1905,"}]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows[: int(sys.argv[2])]))
PY
}
prompts /tmp/p1.jsonl 1
prompts /tmp/p4.jsonl 4

has build && cutlass_build 240
if has tests; then
    export REQUANT_GPU_RECORDS="$OUT/records_tests"
    step gpu_tests 560 python3 -m pytest -q -m gpu -p no:cacheprovider \
        --durations=15 tests/kernels/test_portable.py tests/requant/runtime/test_portable_gpu.py
fi
if has records; then
    TINY="$REC/tiny.ckpt"
    [ -f "$TINY/config.json" ] || step synthetic_tiny 120 python3 -m requant.checkpoint.synthetic tiny "$TINY"
    for be in cutlass triton; do
        for b in 1 4; do
            for regime in pow2 native; do
                step "rec_default_${be}_${regime}_b$b" 120 requant generate --prompts "/tmp/p$b.jsonl" --engine portable \
                    --backend "$be" --regime "$regime" --device cuda --max-new-tokens 16 --no-eos \
                    --json "$REC/default-$be-$regime-b$b.jsonl"
            done
            step "rec_tiny_${be}_b$b" 120 requant generate "$TINY" --prompts "/tmp/p$b.jsonl" --engine portable \
                --backend "$be" --regime pow2 --device cuda --max-new-tokens 16 --no-eos --json "$REC/tiny-$be-pow2-b$b.jsonl"
        done
    done
    for f in "$REC"/*.jsonl; do  # the CPU replay here, as CI will run it
        name=$(basename "$f" .jsonl)
        ck=()
        case "$name" in tiny-*) ck=(--checkpoint "$TINY") ;; esac
        step "cpu_replay_$name" 300 requant replay "$f" ${ck[@]+"${ck[@]}"} --device cpu --threads 2 --json "$STEP_DIR/replay_$name.json"
    done
fi
if has replay17; then
    SYN=/tmp/requant-qwen3-1.7b-synthetic
    [ -f "$SYN/config.json" ] || step synthetic_1.7b 300 python3 -m requant.checkpoint.synthetic qwen3-1.7b "$SYN"
    step rec_17b 300 requant generate "$SYN" --prompts /tmp/p4.jsonl --byte-tokens --engine portable --backend cutlass \
        --regime pow2 --device cuda --max-new-tokens 8 --no-eos --json "$OUT/q17-cutlass-pow2-b4.jsonl"
    step cpu_replay_17b 580 requant replay "$OUT/q17-cutlass-pow2-b4.jsonl" --byte-tokens --device cpu --threads 2 \
        --json "$STEP_DIR/replay_q17.json"
fi
# BENCH_BACKEND=triton spares the CUTLASS build (~4 min on a fresh machine) when STEPS has no build
has bench && step bench_portable 580 python3 -m benchmarks.bench_portable --out "$OUT/bench" --synthetic qwen3-8b \
    --backend "${BENCH_BACKEND:-cutlass}" --reps "${BENCH_REPS:-3}" --profile
cat "$TIMINGS"
