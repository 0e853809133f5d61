#!/usr/bin/env bash
# GPU run of tensor parallelism (requant.tp) on two H200s of one host (the nvidia-h200-x2
# kind), NCCL: `requant tp-check` (TP 1 vs 2 bitwise: logits and greedy tokens) with cutlass
# and triton, native and pow2, int32 and bf16 all-reduce, on the embedded default and on
# Qwen3-1.7B/8B(/14B)-shaped synthetic checkpoints; then benchmarks/bench_tp.py (prefill and
# decode tokens/s, int32 vs bf16 all-reduce in the same launch, NCCL_ALGO and the channel
# count varied, digests compared across the NCCL settings). Written for when that kind is
# lent; NOT RUN yet. Run from the repo root on the GPU machine (nvidia-h200-x2):
#
#     source benchmarks/gpu_setup.sh || exit 1
#     OUT=/some/dir REQUANT_COMMIT=<commit> bash benchmarks/gpu_tp.sh
#
# One call may not run past 600 s: STEPS picks the steps (default "generate build tests check
# shapes bench": check = tp-check on the embedded default, every backend x regime x reduce;
# shapes = tp-check on the synthetic checkpoints); SIZES the synthetic shapes (default
# "qwen3-1.7b qwen3-8b"; add qwen3-14b when the budget allows: generating it takes minutes and
# ~15 GB of disk). Estimated plan, three calls of <= 10 minutes on a fresh machine:
#     STEPS="generate build tests check"   then   STEPS="build shapes"   then   STEPS="build bench"
# (build is instant once cached, but the cache lives on the machine: a new machine rebuilds).
# NCCL settings for the benchmark: NCCL_SETTINGS (bench_tp.py --nccl; default there). The
# benchmark runs the pow2 regime only (speed does not depend on the scales; BENCH_ARGS adds
# e.g. "--regimes native,pow2 --reps 5").
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0) as the lent machines require.
# Each step has a timeout, logs its wall time and exit status to timings.txt, and the script
# goes on after a failure. Files in $OUT (8): env.txt, timings.txt, gpu_tests.log,
# tp_check.log (every summary line), tp_check.jsonl (every --json, one per line),
# bench_tp.json, bench_tp.md, bench.log.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
export NCCL_NVLS_ENABLE=0
CKPT_ROOT="${CKPT_ROOT:-/tmp}"
SIZES="${SIZES-qwen3-1.7b qwen3-8b}"
STEPS="${STEPS-generate build tests check shapes bench}"
BENCH_ARGS="${BENCH_ARGS:-}"
NCCL_SETTINGS="${NCCL_SETTINGS:-}"
TIMINGS="$OUT/timings.txt"
REQUANT="${REQUANT:-python3 cli.py}"   # the CLI (the installed `requant` works too)
DEVICE="${DEVICE:-cuda}"                # cpu + reference BACKENDS: a dry run of the script's plumbing
BACKENDS="${BACKENDS:-cutlass triton}"
TP="${TP:-1,2}"
touch "$TIMINGS"

{
    gpu_env triton
    nvidia-smi topo -m
    python3 -c "import torch; print('nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

synthetic_checkpoints  # CKPTS: the synthetic checkpoint of each of $SIZES (made first with STEPS "generate")

if has build; then
    cutlass_build 400
fi

if has tests; then  # int_mm on CUDA exact; TP 1 vs 2 under NCCL in pytest; the CPU (gloo) tests too
    step gpu_tests 300 bash -c "python3 -m pytest -q -p no:cacheprovider tests/kernels/test_epilogue.py tests/requant/tp \
        > '$OUT/gpu_tests.log' 2>&1; rc=\$?; tail -n 5 '$OUT/gpu_tests.log'; exit \$rc"
fi

check() {  # check LABEL CKPT ARGS... : one tp-check, its summary line and JSON collected
    local label="$1" ckpt="$2"; shift 2
    local json="$OUT/.tp_check.json"
    rm -f "$json"
    # shellcheck disable=SC2086
    step "check_$label" 300 bash -c "$REQUANT tp-check '$ckpt' --tp $TP --device $DEVICE --json '$json' $* 2>&1 \
        | tee -a '$OUT/tp_check.log'; exit \${PIPESTATUS[0]}"
    [ -f "$json" ] && { python3 -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$json" \
        >> "$OUT/tp_check.jsonl"; rm -f "$json"; }
}

if has check; then
    for be in $BACKENDS; do
        for regime in native pow2; do
            for red in int32 bf16; do
                check "default_${be}_${regime}_${red}" requant/data/default --backend "$be" --regime "$regime" \
                    --reduce "$red" --new-tokens 32
            done
        done
    done
fi

if has shapes; then
    for dir in "${CKPTS[@]}"; do
        name=$(basename "$dir")
        for be in $BACKENDS; do
            check "${name}_${be}_pow2_int32" "$dir" --backend "$be" --regime pow2 --new-tokens 16
            check "${name}_${be}_native_int32" "$dir" --backend "$be" --regime native --new-tokens 16
        done
        check "${name}_${BACKENDS%% *}_native_bf16" "$dir" --backend "${BACKENDS%% *}" --regime native --reduce bf16 \
            --new-tokens 16
    done
fi

if has bench && [ ${#CKPTS[@]} -gt 0 ]; then
    nccl=()
    [ -n "$NCCL_SETTINGS" ] && nccl=(--nccl "$NCCL_SETTINGS")
    # every NCCL setting on the smallest shape; NCCL's default on the larger ones (pow2 only)
    # shellcheck disable=SC2086
    step bench_tp_small 590 python3 -m benchmarks.bench_tp "${CKPTS[0]}" --out "$OUT" --regimes pow2 "${nccl[@]}" $BENCH_ARGS \
        >> "$OUT/bench.log" 2>&1
    if [ ${#CKPTS[@]} -gt 1 ]; then
        mkdir -p "$OUT/.big"
        # shellcheck disable=SC2086
        step bench_tp_big 590 python3 -m benchmarks.bench_tp "${CKPTS[@]:1}" --out "$OUT/.big" --nccl default \
            --regimes pow2 $BENCH_ARGS >> "$OUT/bench.log" 2>&1
        python3 - "$OUT" <<'EOF'
import json
import sys
from pathlib import Path

sys.path.insert(0, ".")
from benchmarks.bench_tp import markdown
from requant.io.output import write_bytes_atomic, write_json_atomic

out = Path(sys.argv[1])
small, big = out / "bench_tp.json", out / ".big" / "bench_tp.json"
if small.is_file() and big.is_file():
    rec = json.loads(small.read_text())
    rec["rows"] += json.loads(big.read_text())["rows"]
    write_json_atomic(small, rec)
    write_bytes_atomic(out / "bench_tp.md", markdown(rec).encode())
EOF
        rm -rf "$OUT/.big"
    fi
    tail -n 40 "$OUT/bench.log"
fi
cat "$TIMINGS"
