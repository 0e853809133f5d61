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
# A part travels with the working tree, 64 MiB in all: vllm_wheels.py sizes the parts to fit.
#
# Speed beside vLLM (benchmarks/vllm_speed.py), on an 8B-shaped pow2 synthetic:
#   STAGE=part PART=00 CK8=1 ...    # also starts (setsid) the checkpoint: /tmp/vllm-ck/q8-pow2
#   STAGE=speed OUT=/dir ...        # install, wait for the checkpoint, run the plan of engines
#   STAGE=speed BACKGROUND=1 ...    # the same under setsid (outlives the call); then within 30 s:
#   STAGE=collect OUT=/dir ...      # wait (WAIT_S, default 560) for it and bring the results back
# Qwen3-MoE: the parts made with `python3 -m benchmarks.vllm_wheels --moe` (the MoE
# extension kept), then STAGE=run CKS="moe4-native moe4-pow2": the 30B-A3B synthetic's first 4 layers.
# ENGINES (default requant,vllm,vllm-bi), NO_COMPILE (engines without torch.compile), BUDGET_S
# (default 560; 0 with BACKGROUND), SPEED_ARGS (more vllm_speed arguments) shape the plan.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
PARTS=${PARTS_DIR:-/tmp/vllm-parts}
mkdir -p "$PARTS"
CK=${CK_DIR:-/tmp/vllm-ck}
SPEED=${SPEED_DIR:-/tmp/vllm-speed}  # the speed plan's records (BACKGROUND runs write here too)
Q8="$CK/q8-pow2"
if [ "${STAGE:-run}" = part ]; then
    cp ".vllm/vllm-wheels.tar.part${PART:?set PART}" .vllm/SHA256SUMS "$PARTS/" && ls -la "$PARTS"
    rc=$?
    if [ "${CK8:-0}" = 1 ] && [ ! -e "$CK/q8.started" ]; then  # the 8B checkpoint while the parts travel
        mkdir -p "$CK" && touch "$CK/q8.started"
        setsid nohup bash -c "python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
            && python3 -m requant.checkpoint.synthetic qwen3-8b $CK/q8-native --device cuda \
            && requant convert $CK/q8-native -o $Q8 && rm -rf $CK/q8-native && touch $CK/q8.done \
            || touch $CK/q8.failed" > "$CK/q8.log" 2>&1 < /dev/null &
        echo "8B checkpoint started in the background: $CK/q8.log"
    fi
    exit $rc
fi
speed_out() {  # what comes back of the speed plan (8 files at most)
    cp "$SPEED"/vllm_speed.json "$SPEED"/vllm_speed.md "$SPEED"/env.txt "$SPEED"/timings.txt "$OUT/" 2>/dev/null
    tar -czf "$OUT/speed_logs.tgz" -C "$SPEED" . 2>/dev/null
    cat "$SPEED/vllm_speed.md" 2>/dev/null
}
if [ "${STAGE:-run}" = collect ]; then
    gpu_out
    for _ in $(seq "${WAIT_S:-560}"); do [ -e "$SPEED/finished" ] && break; sleep 1; done
    [ -e "$SPEED/finished" ] || echo "gpu_vllm: the speed plan is still running; collect again" >&2
    speed_out
    [ -e "$SPEED/finished" ]
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
mkdir -p "$CK"
if [ "${STAGE:-run}" = speed ]; then
    if [ ! -e "$CK/q8.done" ]; then
        [ -e "$CK/q8.started" ] || step checkpoint_8b 400 bash -c "python3 -m requant.checkpoint.synthetic qwen3-8b \
            $CK/q8-native --device cuda && requant convert $CK/q8-native -o $Q8 && rm -rf $CK/q8-native \
            && touch $CK/q8.done"
        for _ in $(seq 300); do [ -e "$CK/q8.done" ] || [ -e "$CK/q8.failed" ] && break; sleep 1; done
        [ -e "$CK/q8.done" ] || { echo "gpu_vllm: no 8B checkpoint ($CK/q8.log)" >&2; exit 2; }
    fi
    rm -rf "$SPEED" && mkdir -p "$SPEED" && cp "$KEEP/env.txt" "$SPEED/"
    cmd=(python3 -m benchmarks.vllm_speed all --model "$Q8" --out "$SPEED" --engines "${ENGINES:-requant,vllm,vllm-bi}"
        --no-compile "${NO_COMPILE:-}")
    # shellcheck disable=SC2206
    cmd+=(${SPEED_ARGS:-})
    if [ "${BACKGROUND:-0}" = 1 ]; then
        setsid nohup bash -c '"$@" > '"$SPEED/speed.log"' 2>&1; touch '"$SPEED/finished" _ \
            "${cmd[@]}" --budget-s "${BUDGET_S:-0}" < /dev/null > /dev/null 2>&1 &
        echo "speed plan started in the background; STAGE=collect brings it back"
        exit 0
    fi
    STEP_DIR=$SPEED TIMINGS=$SPEED/timings.txt
    budget=$((${BUDGET_S:-570} - $(elapsed)))  # the install and the checkpoint came out of the call's 600 s
    step speed $((budget + 10)) "${cmd[@]}" --budget-s "$budget"
    touch "$SPEED/finished"
    speed_out
    exit 0
fi
CKS=${CKS:-default-native default-pow2 q17-native q17-pow2}
for ck in $CKS; do
    if [ ! -d "$CK/$ck" ]; then
        case $ck in
            default-native) cp -r requant/data/default "$CK/$ck" ;;
            default-pow2) step convert_default 60 requant convert -o "$CK/$ck" ;;
            q17-native) step synthetic_q17 180 python3 -m requant.checkpoint.synthetic qwen3-1.7b "$CK/$ck" ;;
            q17-pow2) step convert_q17 180 requant convert "$CK/q17-native" -o "$CK/$ck" ;;
            # Qwen3-30B-A3B's first 4 layers at its real widths (512 experts; carry built with --moe)
            moe4-native) step synthetic_moe4 240 python3 -m requant.checkpoint.synthetic qwen3-30b-a3b "$CK/$ck" \
                --layers 4 --device cuda ;;
            moe4-pow2) step convert_moe4 240 requant convert "$CK/moe4-native" -o "$CK/$ck" ;;
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
