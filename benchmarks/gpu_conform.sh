#!/usr/bin/env bash
# GPU measurements for the conformance kit: GPU tests of the cublas backend and of the Triton
# fingerprint, `requant conform` on cutlass / triton / cublas, every reference order and
# catalogue fault fingerprinted on the GPU (benchmarks/conform_all.py), and `requant audit
# --matrix v2` with the real pairs on the embedded default and (time permitting) on a
# Qwen3-1.7B-shaped synthetic. Run from the repository root on the GPU machine, after
# `source benchmarks/gpu_setup.sh`:
#
#     REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) OUT=/some/dir bash benchmarks/gpu_conform.sh
#
# Writes into $OUT (8 files at most: the device tool's limit): conform_{cutlass,triton,cublas}.json,
# conform_all.json, audit_default.tar.gz (the default's audits, v2 with cell results, and a
# cutlass,cublas determinism run) and audit_qwen3-1.7b_{cutlass_triton,cutlass_cublas}.json; the
# caller tees the output into run.log. Every step records its exit status and goes on (a failed
# check is a result). BUDGET_S (seconds from the start, default 380) skips optional steps that
# would not fit.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
BUDGET_S="${BUDGET_S:-380}"
# A CPU smoke test of this script: DEV=cpu PRESET=tiny PAIR_A=reference-cutlass-order,reference-triton-order
# PAIR_B=reference-cutlass-order,cublas PAIR_C=reference-triton-order,cublas (cutlass build and GPU-only runs skipped).
DEV="${DEV:-cuda}"
PRESET="${PRESET:-qwen3-1.7b}"
PAIR_A="${PAIR_A:-cutlass,triton}" PAIR_B="${PAIR_B:-cutlass,cublas}" PAIR_C="${PAIR_C:-triton,cublas}"
gpu_env triton

CKPT=/tmp/requant-$PRESET-synthetic
# The synthetic checkpoint is CPU work: make it in the background while CUTLASS builds.
rm -rf "$CKPT"
python3 -m requant.checkpoint.synthetic "$PRESET" "$CKPT" > /tmp/synthetic.log 2>&1 &
SYN_PID=$!

if [ "$DEV" = cuda ]; then
    cutlass_build 0
    BACKENDS="cutlass triton cublas"
else
    BACKENDS="reference-cutlass-order cublas"
fi
step gpu_tests 0 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cublas.py tests/kernels/test_conform_triton.py
for b in $BACKENDS; do
    step "conform_$b" 0 python3 -m requant.cli conform --backend "$b" --device "$DEV" --json "$OUT/conform_$b.json"
done
step conform_all 0 python3 -m benchmarks.conform_all --device "$DEV" --json "$OUT/conform_all.json"

D=/tmp/audit_default
mkdir -p "$D"
audit_default() {  # audit_default PAIR
    local tag=${1/,/_}
    step "audit_default_$tag" 0 bash -c "python3 -m requant.cli audit --backends $1 --matrix v2 --prompts 8 --device $DEV \
        --json $D/audit_default_$tag.json > $D/audit_default_$tag.log 2>&1; rc=\$?; tail -n 22 $D/audit_default_$tag.log; exit \$rc"
}
audit_synthetic() {  # audit_synthetic PAIR
    local tag=${1/,/_}
    # a synthetic checkpoint has no tokenizer.json: --byte-tokens feeds UTF-8 byte values as token ids
    step "audit_${PRESET}_$tag" 0 bash -c "python3 -m requant.cli audit '$CKPT' --backends $1 --matrix v2 --prompts 8 --byte-tokens \
        --device $DEV --json '$OUT/audit_${PRESET}_$tag.json' > /tmp/audit_q_$tag.log 2>&1; rc=\$?; tail -n 22 /tmp/audit_q_$tag.log; exit \$rc"
}
fits() { [ $(( $(elapsed) + $1 )) -lt "$BUDGET_S" ] || { skip "$2" "$(elapsed) s of $BUDGET_S used"; return 1; }; }

audit_default "$PAIR_A"
audit_default "$PAIR_B"
step wait_synthetic 0 wait "$SYN_PID"
tail -n 3 /tmp/synthetic.log
if [ -f "$CKPT/config.json" ] && fits 75 "audit_${PRESET}_$PAIR_A"; then audit_synthetic "$PAIR_A"; fi
fits 20 "audit_default_$PAIR_C" && audit_default "$PAIR_C"
fits 40 "determinism_default_$PAIR_B" && step "determinism_default_$PAIR_B" 0 bash -c \
    "python3 -m requant.cli determinism --backends $PAIR_B --prompts 8 --new-tokens 32 --device $DEV \
     --json $D/determinism_default.json > $D/determinism_default.log 2>&1; rc=\$?; tail -n 12 $D/determinism_default.log; exit \$rc"
if [ -f "$CKPT/config.json" ] && fits 75 "audit_${PRESET}_$PAIR_B"; then audit_synthetic "$PAIR_B"; fi
tar -C /tmp -czf "$OUT/audit_default.tar.gz" audit_default
shopt -s nullglob
python3 -m benchmarks.conform_tables "$D"/audit_default_*.json "$OUT"/audit_"$PRESET"_*.json
echo "total $(elapsed) s"
