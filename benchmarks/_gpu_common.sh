# What every benchmarks/gpu_*.sh script shares; sourced, never run on its own:
#
#     source "$(dirname "$0")/_gpu_common.sh"
#
# On sourcing: the working directory becomes the repository root, and REQUANT_COMMIT is set and
# exported (benchmarks/commit_id.sh: a declared commit, else git, else "unknown"; the device machine
# gets no .git) with PYTHONUNBUFFERED=1. Then:
#   gpu_out [DEFAULT]        $OUT (DEFAULT when unset; an error when both are missing) made and made
#                            absolute
#   gpu_env [MODULE...]      date, commit, the GPU (nvidia-smi), torch and CUDA, MODULE versions
#   step NAME LIMIT_S CMD... CMD under `timeout -k 10 LIMIT_S` (0: no limit). Its output goes to
#                            $STEP_DIR/NAME.log when STEP_DIR is set, appended to $STEP_LOG (after a
#                            "=== NAME" header) when STEP_LOG is set, else to the terminal. Then one
#                            line "== NAME  S.mmm s  rc=RC  (t=T s)" is printed and appended to $TIMINGS
#                            and $STEP_LOG when set. RC and STEP_S hold the exit status and the
#                            seconds; it returns 0: a failed step is a result, the script goes on
#   skip NAME WHY            the same line for a step not run (RC=125)
#   cutlass_build LIMIT_S [verbose]   the CUTLASS JIT build as a step; torch's lock file from a
#                            killed build is removed before and after (every later build would wait)
#   has STEP                 whether STEP is one of the words of $STEPS
#   synthetic_checkpoints    CKPTS=($CKPT_ROOT/requant-SIZE-synthetic for each SIZE of $SIZES that
#                            exists), each made first (python -m requant.checkpoint.synthetic, a step) when
#                            STEPS has "generate"
#   elapsed / left           seconds since sourcing / seconds left of $TOTAL_S
#   budget NAME EST_S        true when EST_S seconds are left of $TOTAL_S, else a skip line for NAME
#   qwen3_ckpt SIZE          $CKPT_ROOT/requant-qwen3-SIZE-synthetic (CKPT_ROOT default /tmp)
#   qwen3_synthetic SIZE LIMIT_S [EST_S]   that checkpoint made on the GPU when missing and STEPS has
#                            "generate" (a step synthetic_SIZE, 4 GB shards); with EST_S, only when
#                            `budget` allows it (else its skip line)
#   carried_wheels           the wheels carried in .whl/ and this checkout installed (gpu_setup.sh);
#                            nothing when none is carried
# shellcheck shell=bash

_GPU_CALLER_PWD=$PWD  # a relative $OUT names a folder of the caller's directory
cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
_GPU_T0=$SECONDS
REQUANT_COMMIT=$(bash benchmarks/commit_id.sh)
export REQUANT_COMMIT PYTHONUNBUFFERED=1
RC=0
STEP_S=0

gpu_out() {
    OUT="${OUT:-${1:-}}"
    : "${OUT:?set OUT to the results directory}"
    case "$OUT" in /*) ;; *) OUT="$_GPU_CALLER_PWD/$OUT" ;; esac
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
}

gpu_env() {
    date -u
    echo "commit $(bash benchmarks/commit_id.sh)"
    echo "tree $(bash benchmarks/commit_id.sh --tree)"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
        --format=csv
    timeout 60 python3 - "$@" <<'EOF'
import importlib
import sys

import torch

words = ["torch", torch.__version__, "cuda", torch.version.cuda]
for name in sys.argv[1:]:
    try:
        words += [name, importlib.import_module(name).__version__]
    except Exception as exc:  # noqa: BLE001 - the record says what is missing
        words += [name, f"missing ({type(exc).__name__})"]
print(*words)
EOF
}

elapsed() { echo $((SECONDS - _GPU_T0)); }
left() { echo $((${TOTAL_S:?set TOTAL_S} - (SECONDS - _GPU_T0))); }
budget() { [ "$(left)" -ge "$2" ] && return 0; skip "$1" "$(left) s left of TOTAL_S=$TOTAL_S, needs ~$2 s"; return 1; }
qwen3_ckpt() { echo "${CKPT_ROOT:-/tmp}/requant-qwen3-$1-synthetic"; }

qwen3_synthetic() {
    local d
    d=$(qwen3_ckpt "$1")
    [ -f "$d/config.json" ] && return 0
    has generate || return 0
    [ -n "${3:-}" ] && { budget "synthetic_$1" "$3" || return 0; }
    step "synthetic_$1" "$2" python3 -m requant.checkpoint.synthetic "qwen3-$1" "$d" --device cuda --shard-size 4000000000
}

carried_wheels() {
    ls .whl/*.whl > /dev/null 2>&1 || return 0
    source benchmarks/gpu_setup.sh
}
has() { case " ${STEPS:-} " in *" $1 "*) return 0 ;; esac; return 1; }

_step_line() {  # _step_line TEXT: to the terminal, $TIMINGS and $STEP_LOG
    echo "$1"
    [ -n "${TIMINGS:-}" ] && echo "$1" >> "$TIMINGS"
    [ -n "${STEP_LOG:-}" ] && echo "$1" >> "$STEP_LOG"
    return 0
}

step() {
    local name="$1" limit="$2"; shift 2
    local t0 t1 ms
    local -a run=("$@")
    [ "$limit" -gt 0 ] && run=(timeout -k 10 "$limit" "$@")
    t0=$(date +%s%N)
    if [ -n "${STEP_DIR:-}" ]; then
        "${run[@]}" > "$STEP_DIR/$name.log" 2>&1
    elif [ -n "${STEP_LOG:-}" ]; then
        echo "=== $name (limit ${limit} s) ===" >> "$STEP_LOG"
        "${run[@]}" >> "$STEP_LOG" 2>&1
    else
        "${run[@]}"
    fi
    RC=$?
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    STEP_S=$((ms / 1000))
    _step_line "$(printf '== %-34s %5d.%03d s  rc=%d  (t=%d s)' "$name" $((ms / 1000)) $((ms % 1000)) "$RC" "$(elapsed)")"
    return 0
}

skip() {
    RC=125
    STEP_S=0
    _step_line "$(printf '== %-34s skipped: %s  (t=%d s)' "$1" "$2" "$(elapsed)")"
}

synthetic_checkpoints() {
    CKPTS=()
    local size dir
    for size in ${SIZES:-}; do
        dir="${CKPT_ROOT:-/tmp}/requant-$size-synthetic"
        if has generate && [ ! -f "$dir/config.json" ]; then
            step "synthetic_$size" 900 python3 -m requant.checkpoint.synthetic "$size" "$dir"
        fi
        [ -f "$dir/config.json" ] && CKPTS+=("$dir")
    done
    return 0
}

cutlass_build() {
    local cache="${REQUANT_CUTLASS_CACHE:-$HOME/.cache/requant/cutlass}"
    local verbose=""
    [ "${2:-}" = verbose ] && verbose="verbose=True"
    rm -f "$cache/lock"
    step cutlass_build "$1" python3 -c "import requant.kernels.cutlass as c; c.build($verbose); print('cutlass built')"
    local rc=$RC
    rm -f "$cache/lock"  # a timed-out build must not block the next steps
    RC=$rc
}
