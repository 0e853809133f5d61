#!/usr/bin/env bash
# requant's speed measurements without vLLM in one GPU call (one H200, ~8 min; no carry needed with the
# default Triton backend):
#   * goal 2, split-K's defaults: bench_splitk at decode M 1..16 with a SLOTS sweep (its summary
#     chooses SLOTS and SPLIT_K_MAX_M);
#   * goal 2, the fold threshold and the context ratios: bench_long_context --parts fold,decode
#     (chunk launches, both attention paths; batch-1 decode at contexts 128, 4096, 16384);
#   * goal 3, the portable engine's price beside the fast engine: bench_portable (prefill 1 x 2048
#     and 1 x 8192, decode batch 1 and 64, interleaved, median [min-max]) with --profile (its GPU time
#     by kernel), and the sweep of its attention's tokens per prefill program and warps at 1 x 2048
#     (--tokens: kernels/triton/portable.py PREFILL_TOKENS and WARPS, chosen by it; bits checked).
#
#     OUT=/some/dir bash benchmarks/gpu_speed4.sh
#
# STEPS (default "splitk fold portable") picks the steps; BACKEND (default triton; cutlass needs
# .whl carried and adds its build) the GEMMs of fold and portable. Files in $OUT (6): env.txt,
# timings.txt, bench_splitk.json, bench_long_context.json, bench_portable.json, speed4.tgz (every
# log and the Markdown of each; the Markdown is also remade from the JSON by each script's markdown()).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
BACKEND=${BACKEND:-triton}
if [ "$BACKEND" = cutlass ]; then
    source benchmarks/gpu_setup.sh || exit 1
    cutlass_build 300
else
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
fi
W=/tmp/speed4
rm -rf "$W" && mkdir -p "$W"
STEP_DIR=$W TIMINGS=$W/timings.txt
STEPS="${STEPS:-splitk fold portable}"
gpu_env triton > "$W/env.txt" 2>&1
cat "$W/env.txt"
has splitk && step splitk 170 python3 -m benchmarks.bench_splitk --out "$W/splitk" --m 1,2,4,8,12,16 \
    --slots 132,264,396,528 --rep-ms 100
has fold && step fold 170 python3 -m benchmarks.bench_long_context --synthetic qwen3-8b --backend "$BACKEND" \
    --out "$W/fold" --parts fold,decode --contexts 128,4096,16384 --no-transformers --reps 5
has portable && step portable 300 python3 -m benchmarks.bench_portable --out "$W/portable" --synthetic qwen3-8b \
    --backend "$BACKEND" --reps 5 --profile --tokens none,2,4,8,16 --warps 4,8 --sweep-at 2048
cp "$W/env.txt" "$W/timings.txt" "$OUT/"
for f in splitk/bench_splitk fold/bench_long_context portable/bench_portable; do
    [ -f "$W/$f.json" ] && cp "$W/$f.json" "$OUT/"
    [ -f "$W/$f.md" ] && cat "$W/$f.md"
done
tar -czf "$OUT/speed4.tgz" -C "$W" .
cat "$W/timings.txt"
