#!/usr/bin/env bash
# GPU run of the kernel speed benchmark and the eager host overhead, on one H200, from the
# repository root, no network, no .git needed, finishing inside TOTAL_S (default 540 s) wall:
#   REQUANT_COMMIT=<sha> OUT=<dir> bash benchmarks/gpu_speed.sh
# Needs .whl/ (from ../shared/tools/gpu-wheels.sh): benchmarks/gpu_setup.sh installs it.
# Steps, each time-limited (never past TOTAL_S), logged, and run even when an earlier one failed:
#   1. environment (nvidia-smi, versions, REQUANT_COMMIT: the machine gets no .git)
#   2. CUTLASS JIT build, timed (stale lock removed first), per-unit times from ninja's log
#   3. GPU tests: tests/kernels/test_gpu.py (every tile incl. the new 64x128 one, bitwise
#      against its emulated order, the cached Triton launches), before anything is timed;
#      only the Triton ones when the build failed
#   4. the Triton CPU suite compiled for the GPU (every config of CONFIGS, launch keys)
#   5. benchmarks/bench_speed.py with the time that is left (writes its JSON as it goes, and
#      its Markdown when its budget runs out or it is stopped)
#   6. bench_speed_report.py: the Markdown again from the JSON (in case 5 was killed) and a PNG
# Files in $OUT (6): gpu_speed.log (everything), steps.json, build_units.txt, bench_speed.json,
# bench_speed.md, bench_speed.png. The last lines printed are a short summary table.
set -uo pipefail
# 540 s: the caller's limit is 600 s, with the wheel install before this script and the
# copy-back after it. Build 70-90 s, tests ~60 s, the report ~10 s: the benchmark gets the rest.
TOTAL_S=${TOTAL_S:-540}
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out /tmp/requant_gpu_out
STEP_LOG="$OUT/gpu_speed.log"
: > "$STEP_LOG"
source benchmarks/gpu_setup.sh || exit 1
STEPS_JSON=()

limited() {  # limited NAME LIMIT_S RESERVE_S COMMAND...: a step of min(LIMIT, left - RESERVE) s, in steps.json
  local name=$1 limit=$2 reserve=$3; shift 3
  local avail=$(( $(left) - reserve ))
  [ "$avail" -lt "$limit" ] && limit=$avail
  if [ "$limit" -lt 5 ]; then
    skip "$name" "no time left"
    STEPS_JSON+=("{\"step\": \"$name\", \"rc\": null, \"seconds\": 0}")
    return
  fi
  step "$name" "$limit" "$@"
  STEPS_JSON+=("{\"step\": \"$name\", \"rc\": $RC, \"seconds\": $STEP_S, \"limit_s\": $limit}")
}

{
  echo "TOTAL_S: $TOTAL_S"
  gpu_env triton
  nvcc --version | tail -2; nproc; free -g | head -2
} >> "$STEP_LOG" 2>&1

# A killed build leaves torch's FileBaton lock behind and every later build would wait on it.
rm -f "$REQUANT_CUTLASS_CACHE/lock"
limited cutlass-build 240 240 python3 -c "import requant.kernels.cutlass as c; c.build(verbose=True)"
BUILD_RC=$RC
rm -f "$REQUANT_CUTLASS_CACHE/lock"  # nothing builds now; a timed-out build must not block the next steps
# Per-unit compile times (ninja log: start ms, end ms, mtime, target); the former build had 7
# tile units and took 65-70 s on this machine type (benchmarks/results/kernels_gpu_tests.log).
timeout 20 python3 - "$REQUANT_CUTLASS_CACHE/.ninja_log" > "$OUT/build_units.txt" 2>&1 <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if not l.startswith("#")]
for start, end, _, target, *_ in rows:
    print(f"{target:40s} {(int(end) - int(start)) / 1000:7.1f} s")
print(f"units: {len(rows)}, wall (first start to last end): {(max(int(r[1]) for r in rows) - min(int(r[0]) for r in rows)) / 1000:.1f} s")
EOF
cat "$OUT/build_units.txt" >> "$STEP_LOG"

if [ "$BUILD_RC" -eq 0 ]; then
  limited gpu-tests 150 240 python3 -m pytest -q -m gpu tests/kernels/test_gpu.py -p no:cacheprovider -s
  NO_CUTLASS=()
else  # every CUTLASS test would retry the failed build: only the Triton ones
  limited gpu-tests-triton-only 120 240 python3 -m pytest -q -m gpu tests/kernels/test_gpu.py -p no:cacheprovider -s -k triton
  NO_CUTLASS=(--no-cutlass)
fi
limited cpu-suite-on-gpu 100 200 python3 -m pytest -q tests/kernels/test_triton.py tests/kernels/test_triton_launch.py \
  tests/kernels/test_reference.py -p no:cacheprovider

# The benchmark: a budget for starting items, a hard limit 60 s later (the longest item, the
# 8192^3 tile sweep with first compiles, takes ~30 s); on SIGTERM it still writes its Markdown.
L=$(( $(left) - 25 ))
if [ "$L" -gt 40 ]; then
  limited bench-speed "$L" 25 python3 -m benchmarks.bench_speed --out "$OUT" --budget-s $((L - 60)) ${NO_CUTLASS[@]+"${NO_CUTLASS[@]}"}
else
  skip bench-speed "only $(left) s left"
fi
rm -f "$OUT"/.bench_speed.*.tmp  # temporaries of a killed writer
if [ -f "$OUT/bench_speed.json" ]; then
  limited report 30 0 python3 -m benchmarks.bench_speed_report "$OUT/bench_speed.json" --md "$OUT/bench_speed.md" --png "$OUT/bench_speed.png"
fi
rm -f "$OUT"/.bench_speed.*.tmp

printf '{"commit": "%s", "total_s": %d, "total_limit_s": %d, "steps": [%s]}\n' "$REQUANT_COMMIT" "$(elapsed)" \
  "$TOTAL_S" "$(IFS=,; echo "${STEPS_JSON[*]}")" > "$OUT/steps.json"
echo
echo "steps ($(elapsed) s of ${TOTAL_S}):"
grep -E "^== " "$STEP_LOG" | sed 's/^== /  /'
grep -E "^[0-9]+ (passed|failed)|, [0-9]+ (passed|failed)|^(FAILED|ERROR) " "$STEP_LOG" | head -20 | sed 's/^/  tests: /'
tail -1 "$OUT/build_units.txt" | sed 's/^/  build: /'
if [ -f "$OUT/bench_speed.md" ]; then
  sed -n '/<!-- summary -->/,$p' "$OUT/bench_speed.md" | tail -n +2
fi
exit 0
