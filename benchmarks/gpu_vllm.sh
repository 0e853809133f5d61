#!/usr/bin/env bash
# vLLM 0.26.0 serving requant's checkpoints on one H200. vLLM's wheels do not fit one call's
# carry, so they travel in parts (benchmarks/vllm_wheels.py fills .vllm/ here):
#
#   STAGE=part PART=00 bash benchmarks/gpu_vllm.sh    # carry .vllm/SHA256SUMS and .vllm/vllm-wheels.tar.part00
#   ... one call per part, each within the machine's warm window (30 s after the last call) ...
#   STAGE=run OUT=/dir bash benchmarks/gpu_vllm.sh    # join, check, install, serve, compare
#
# The parts wait under /tmp/vllm-parts on the GPU machine. Results in $OUT: env.txt,
# timings.txt, run_*.json (one per checkpoint and kernel), vllm_compare.json, requant_*.json.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
PARTS=/tmp/vllm-parts
mkdir -p "$PARTS"
if [ "${STAGE:-run}" = part ]; then
    cp ".vllm/vllm-wheels.tar.part${PART:?set PART}" .vllm/SHA256SUMS "$PARTS/" && ls -la "$PARTS"
    exit $?
fi
gpu_out
KEEP=/tmp/vllm-out  # results of earlier run calls on this machine (CKS picks the checkpoints of one call)
mkdir -p "$KEEP"
if [ ! -d /tmp/vsite/vllm ]; then
    cat "$PARTS"/vllm-wheels.tar.part* > /tmp/vllm-wheels.tar
    want=$(awk '$2 == "vllm-wheels.tar" {print $1}' "$PARTS/SHA256SUMS")
    got=$(sha256sum /tmp/vllm-wheels.tar | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "gpu_vllm: joined tar sha256 $got, want $want" >&2; exit 2; }
    mkdir -p /tmp/vllm-w && tar -xf /tmp/vllm-wheels.tar -C /tmp/vllm-w
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vsite \
        /tmp/vllm-w/wheels/*.whl || exit 2
fi
export PYTHONPATH=/tmp/vsite${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
gpu_env vllm > "$KEEP/env.txt" 2>&1
cat "$KEEP/env.txt"
STEP_DIR=$KEEP TIMINGS=$KEEP/timings.txt
CK=/tmp/vllm-ck
mkdir -p "$CK"
CKS=${CKS:-default-native default-pow2 q17-native q17-pow2}
for ck in $CKS; do
    if [ ! -d "$CK/$ck" ]; then
        case $ck in
            default-native) cp -r requant/data/default "$CK/$ck" ;;
            default-pow2) step convert_default 60 requant convert -o "$CK/$ck" ;;
            q17-native) step synthetic_q17 180 python3 -m requant.checkpoint.synthetic qwen3-1.7b "$CK/$ck" ;;
            q17-pow2) step convert_q17 180 requant convert "$CK/q17-native" -o "$CK/$ck" ;;
        esac
    fi
    for k in cutlass triton; do
        step "run_${ck}_$k" 200 python3 -m benchmarks.vllm_client one --model "$CK/$ck" --kernel "$k" \
            --out "$KEEP/run_${ck}_$k.json"
    done
    case $ck in
        *-pow2) step "requant_$ck" 150 python3 -m benchmarks.vllm_client requant --model "$CK/$ck" \
            --runs "$KEEP/run_${ck}_cutlass.json" --out "$KEEP/requant_$ck.json" ;;
    esac
done
step compare 60 python3 -m benchmarks.vllm_client compare "$KEEP"/run_*.json --out "$KEEP/vllm_compare.json"
tar -czf "$OUT/vllm_results.tgz" -C "$KEEP" .
cp "$KEEP/timings.txt" "$KEEP/vllm_compare.json" "$OUT/" 2>/dev/null
grep -h -i "int8\|ScaledMM\|Using .*kernel\|Error\|Traceback" "$KEEP"/run_*.log | sort | uniq -c | sort -rn | head -40
