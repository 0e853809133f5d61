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
: "${OUT:?set OUT to the results directory}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
CKPT_ROOT="${CKPT_ROOT:-/tmp}"
SIZES="${SIZES-qwen3-1.7b qwen3-8b}"    # unset: both; empty: none
STEPS="${STEPS-generate tests determinism bench}"
BENCH_ARGS="${BENCH_ARGS:-}"            # e.g. "--reps 5" or "--det-new-tokens 64"
TIMINGS="$OUT/timings.txt"
touch "$TIMINGS"

now() { date +%s%N; }
step() {  # step NAME TIMEOUT_S CMD... : run with a timeout, log wall time and exit status
    local name="$1" limit="$2"; shift 2
    local t0 t1 rc
    t0=$(now)
    timeout "$limit" "$@"
    rc=$?
    t1=$(now)
    local ms=$(( (t1 - t0) / 1000000 ))
    printf '%-26s %5d.%03d s  rc=%d\n' "$name" $((ms / 1000)) $((ms % 1000)) "$rc" | tee -a "$TIMINGS"
    return 0
}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

{
    date -u
    echo "commit $(bash benchmarks/commit_id.sh)"   # $REQUANT_COMMIT, else git, else unknown
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

CKPTS=()
for size in $SIZES; do
    dir="$CKPT_ROOT/requant-$size-synthetic"
    if has generate && [ ! -f "$dir/config.json" ]; then
        step "synthetic_$size" 900 python3 -m requant.synthetic "$size" "$dir"
    fi
    [ -f "$dir/config.json" ] && CKPTS+=("$dir")
done

if has tests || has determinism || has bench; then
    rm -f "${REQUANT_CUTLASS_CACHE:-$HOME/.cache/requant/cutlass}/lock"   # a stale lock from a killed build
    step cutlass_build 400 python3 -c "import requant.kernels.cutlass as c; c.build(); print('cutlass built')"
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
    step bench_runtime 590 bash -c "python3 benchmarks/bench_runtime.py ${CKPTS[*]} --out '$OUT' $BENCH_ARGS > '$OUT/bench.log' 2>&1; rc=\$?; exit \$rc"
    tail -n 60 "$OUT/bench.log"
fi
if has fast; then
    mkdir -p "$OUT/fast"
    # shellcheck disable=SC2086
    step bench_runtime_fast 590 bash -c "python3 benchmarks/bench_runtime.py --synthetic qwen3-1.7b,qwen3-8b --out '$OUT/fast' \
        --reps 5 --reference $BENCH_ARGS > '$OUT/fast/bench.log' 2>&1"
    tail -n 40 "$OUT/fast/bench_runtime_fast.md" 2>/dev/null
fi
cat "$TIMINGS"
