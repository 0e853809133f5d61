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
# Writes into $OUT (8 files at most: the device tool's limit): run.log, conform_{cutlass,triton,
# cublas}.json, conform_all.json, audit_default.tar.gz (three default audits, v2, with cell
# results) and audit_qwen3-1.7b_{cutlass_triton,cutlass_cublas}.json. Every step records its exit
# status and goes on (a failed check is a result). BUDGET_S (default 400) skips the synthetic
# audits that would not fit.
set -uo pipefail
: "${OUT:?set OUT to the results directory}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET_S="${BUDGET_S:-400}"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
step() {  # step NAME CMD...
    local name="$1"; shift
    local t0 rc
    t0=$(date +%s%N)
    "$@"
    rc=$?
    printf '== %-34s %6d ms  rc=%d  (t=%ds)\n' "$name" $(( ($(date +%s%N) - t0) / 1000000 )) "$rc" "$(elapsed)"
    return 0
}
export PYTHONUNBUFFERED=1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "commit $(bash benchmarks/commit_id.sh)"

step cutlass_build python3 -c "import requant.kernels.cutlass as c; c.build(); print('cutlass built')"
step gpu_tests python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cublas.py tests/kernels/test_conform_triton.py
for b in cutlass triton cublas; do
    step "conform_$b" python3 -m requant.cli conform --backend "$b" --device cuda --json "$OUT/conform_$b.json"
done
step conform_all python3 benchmarks/conform_all.py --device cuda --json "$OUT/conform_all.json"

mkdir -p /tmp/audit_default
for pair in cutlass,triton cutlass,cublas triton,cublas; do
    tag=${pair/,/_}
    step "audit_default_$tag" bash -c "python3 -m requant.cli audit --backends $pair --matrix v2 --prompts 8 \
        --json /tmp/audit_default/audit_default_$tag.json > /tmp/audit_default/audit_default_$tag.log 2>&1; rc=\$?; \
        tail -n 22 /tmp/audit_default/audit_default_$tag.log; exit \$rc"
done
tar -C /tmp -czf "$OUT/audit_default.tar.gz" audit_default
python3 benchmarks/conform_tables.py /tmp/audit_default/audit_default_cutlass_triton.json \
    /tmp/audit_default/audit_default_cutlass_cublas.json /tmp/audit_default/audit_default_triton_cublas.json

CKPT=/tmp/requant-qwen3-1.7b-synthetic
if [ "$(elapsed)" -lt $(( BUDGET_S - 250 )) ]; then
    step synthetic_qwen3-1.7b python3 -m requant.synthetic qwen3-1.7b "$CKPT"
    for pair in cutlass,triton cutlass,cublas; do
        tag=${pair/,/_}
        if [ "$(elapsed)" -lt $(( BUDGET_S - 70 )) ]; then
            step "audit_qwen3-1.7b_$tag" bash -c "python3 -m requant.cli audit '$CKPT' --backends $pair --matrix v2 --prompts 8 \
                --json '$OUT/audit_qwen3-1.7b_$tag.json' > /tmp/audit_q_$tag.log 2>&1; rc=\$?; tail -n 22 /tmp/audit_q_$tag.log; exit \$rc"
            [ -f "$OUT/audit_qwen3-1.7b_$tag.json" ] && python3 benchmarks/conform_tables.py "$OUT/audit_qwen3-1.7b_$tag.json"
        else
            echo "== skipped audit_qwen3-1.7b_$tag: $(elapsed) s of $BUDGET_S used"
        fi
    done
else
    echo "== skipped the Qwen3-1.7B synthetic: $(elapsed) s of $BUDGET_S used"
fi
echo "total $(elapsed) s"
