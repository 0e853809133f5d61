#!/usr/bin/env bash
# The audit under cProfile on the GPU: where the host's time goes (the audit is dispatch and
# Python bound on CUDA, where a CPU profile shows the arithmetic instead). Back: audit.prof (read
# with python -m pstats), profile.txt (by own time and by cumulative time), the audit's log.
#   OUT=$OUT PRESET=qwen3-30b-a3b LAYERS=8 bash benchmarks/gpu_profile_audit.sh   (carry .whl)
# PROFILER=util instead: the audit without cProfile while nvidia-smi samples the GPU's utilization
# every 100 ms (the share of each sample in which a kernel ran); back util.csv and util.txt, the mean
# per stage of the audit's log (benchmarks/gpu_util_stages.py): a stage far below 100% is waiting on
# the host. cProfile sees the main thread only; the cells are scored on a worker thread.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
PRESET="${PRESET:-qwen3-30b-a3b}"
LAYERS="${LAYERS:-8}"                   # the preset's first LAYERS layers (0: all)
CKPT="${CKPT_DIR:-/tmp/requant-$PRESET-${LAYERS}l-synthetic}"
BACKENDS="${BACKENDS:-cutlass,triton}"
carried_wheels || exit 1
gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
case "$BACKENDS" in *cutlass*) cutlass_build 0 ;; esac
if [ ! -f "$CKPT/config.json" ]; then
    step "synthetic_$PRESET" 0 python3 -c "
import dataclasses
from requant.checkpoint.synthetic import PRESETS, generate
p = PRESETS['$PRESET']
p = dataclasses.replace(p, layers=$LAYERS) if $LAYERS else p
print(generate(p, '$CKPT', device='cuda', shard_size=5_000_000_000))"
fi
if [ "${PROFILER:-cprofile}" = util ]; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 100 \
        > "$OUT/util.csv" 2> /dev/null &
    sampler=$!
    step audit_sampled 0 bash -c "python3 cli.py audit '$CKPT' --byte-tokens --phases ${PHASES:-prefill,decode} \
        --backends $BACKENDS --prompts ${PROMPTS:-8} --device cuda --json /tmp/sampled-audit.json \
        > '$OUT/audit.log' 2>&1; rc=\$?; tail -n 12 '$OUT/audit.log'; exit \$rc"
    kill "$sampler" 2> /dev/null
    python3 -m benchmarks.gpu_util_stages "$OUT/util.csv" "$OUT/audit.log" | tee "$OUT/util.txt"
    exit "$RC"
fi
step audit_profiled 0 bash -c "python3 -m cProfile -o '$OUT/audit.prof' cli.py audit '$CKPT' --byte-tokens \
    --phases ${PHASES:-prefill,decode} --backends $BACKENDS --prompts ${PROMPTS:-8} --device cuda \
    --json /tmp/profiled-audit.json > '$OUT/audit.log' 2>&1; rc=\$?; tail -n 12 '$OUT/audit.log'; exit \$rc"
python3 - "$OUT/audit.prof" > "$OUT/profile.txt" 2>&1 <<'PY'
import pstats, sys
for key in ("tottime", "cumulative"):
    pstats.Stats(sys.argv[1]).sort_stats(key).print_stats(70)
PY
head -c 6000 "$OUT/profile.txt"
