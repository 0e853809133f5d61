#!/usr/bin/env bash
# What a cold Triton cache costs the audit (a user's first run): the audit of CKPT (default the
# 1.7B synthetic under /tmp) with an empty TRITON_CACHE_DIR, then again with that cache warm, and
# the kernels that were built (one <kernel>.json per build in the cache: a name counted n times
# was specialised n ways). From the repository root on the GPU machine:
#
#     OUT=/some/dir CKPT=/tmp/requant-qwen3-1.7b-synthetic bash benchmarks/triton_cold_start.sh
#
# Files in $OUT: cold.json/.log, warm.json/.log (the audits' JSON and logs; `timings` per stage),
# triton_builds.txt (builds per kernel name), summary.txt.
set -uo pipefail
OUT="${OUT:?set OUT}"
CKPT="${CKPT:-/tmp/requant-qwen3-1.7b-synthetic}"
mkdir -p "$OUT"
CACHE=$(mktemp -d)
run() {  # run NAME
    local t0 t1 rc
    t0=$(date +%s.%N)
    TRITON_CACHE_DIR="$CACHE" python3 cli.py audit "$CKPT" --backends cutlass,triton --byte-tokens \
        --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "$1: rc=$rc wall=$(python3 -c "print(round($t1 - $t0, 1))") s" >> "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
run cold
find "$CACHE" -name '*.json' ! -name '__grp__*' -printf '%f\n' | sed 's/\.json$//' | sort | uniq -c | sort -rn \
    > "$OUT/triton_builds.txt"
echo "triton builds: $(awk '{s += $1} END {print s}' "$OUT/triton_builds.txt")" >> "$OUT/summary.txt"
run warm
python3 - "$OUT" >> "$OUT/summary.txt" <<'PY'
import json, sys
for name in ("cold", "warm"):
    try:
        t = json.load(open(f"{sys.argv[1]}/{name}.json")).get("timings", {})
    except (OSError, ValueError) as e:
        print(name, "no JSON:", e)
        continue
    print(name, json.dumps(t))
PY
cat "$OUT/summary.txt"
head -40 "$OUT/triton_builds.txt"
rm -rf "$CACHE"
