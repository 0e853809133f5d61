#!/usr/bin/env bash
# Audit truth on one H100/H200, in one 10-minute call: the audit's per-layer evidence compares the two
# kernels it names. On the Qwen3-1.7B-shaped synthetic:
#   pair_cutlass   requant audit --backends cutlass,reference-cutlass-order   (a real kernel against
#   pair_triton    requant audit --backends triton,reference-triton-order      its own emulation; exit 0
#                  expected: every layer bitwise equal under both regimes, no kernel fault)
#   faulty         --backends cutlass,benchmarks._faulty_cutlass:flip_one_at_decode --order cutlass-order
#                  (CUTLASS with one element one spacing off at M <= 8; exit 1 expected, the verdict
#                  naming that kernel, decode M=1 and M=8, one element per layer, first at [M-1, N-1])
# then `--injection` at 1.7B (prefill phase, 32 tokens; on CUDA its 22 runs per regime go as one batch,
# audit/phases/injection.py; at most 180 s), the audit sizes re-timed with cutlass,triton (audit_0.6b,
# audit_1.7b, audit_8b), then with what is left
#   gpu_tests      pytest -m gpu tests/audit/test_batched.py tests/audit/phases/test_injection.py (batched
#                  = per-cell for both real pairs and cutlass,triton on the tiny synthetic; the injection's
#                  batched runs = the runs one after another on CUDA)
# and audit_14b. A second call for what a first one skipped: STEPS="build tests", STEPS="build generate
# injection" INJ_SIZES="8b" (the issue's 8B injection), or STEPS="build generate sizes" SIZES="14b 32b".
# From the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_audit_truth.sh
#
# STEPS (default "build generate pairs tests sizes injection") picks the steps (and `groups`, after
# `sizes`: the 1.7B audit again with REQUANT_AUDIT_GROUPS=0, every Linear alone, its JSON compared
# with the grouped one's by benchmarks.audit_equality --compare); SIZES (default "0.6b
# 1.7b 8b") the sizes re-timed after the injection, EXTRA_SIZES (default "14b") after the tests;
# TOTAL_S (default 570) the budget: a step that would start with less than its estimate left is
# skipped (summary.txt says so). Each step runs under `timeout` (step in _gpu_common.sh). Checkpoints: $CKPT_ROOT/requant-qwen3-SIZE-
# synthetic (default /tmp), made on the GPU and reused. The device returns few files, so $OUT holds
# env.txt, timings.txt, summary.txt, README.md and truth.tgz (every step's .log and .json).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
carried_wheels || exit 1
STEPS="${STEPS-build generate pairs tests sizes injection}"
SIZES="${SIZES-0.6b 1.7b 8b}"
EXTRA_SIZES="${EXTRA_SIZES-14b}"  # after the tests, while time is left
INJ_SIZES="${INJ_SIZES-1.7b}"
TOTAL_S="${TOTAL_S:-570}"
CKPT_ROOT="${CKPT_ROOT:-/tmp}"
W="$OUT/truth"
mkdir -p "$W"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

audit() {  # audit NAME SIZE LIMIT_S ARGS...: requant audit, JSON and log under $W, the log's tail shown
    local name="$1" d
    d=$(qwen3_ckpt "$2")
    local limit="$3"
    shift 3
    [ -f "$d/config.json" ] || { skip "$name" "no checkpoint $d"; return 0; }
    step "$name" "$limit" bash -c "python3 cli.py audit '$d' --byte-tokens $* --json '$W/$name.json' \
        > '$W/$name.log' 2>&1; rc=\$?; tail -n 8 '$W/$name.log'; exit \$rc"
}

if has build; then
    cutlass_build 240
fi
qwen3_synthetic 1.7b 120 40
if has pairs; then
    # the first Triton launches of the machine compile (cold): the first audit pays them
    budget pair_cutlass 60 && audit pair_cutlass 1.7b 200 --backends cutlass,reference-cutlass-order
    budget pair_triton 40 && audit pair_triton 1.7b 150 --backends triton,reference-triton-order
    budget faulty 40 && audit faulty 1.7b 150 \
        --backends cutlass,benchmarks._faulty_cutlass:flip_one_at_decode --order cutlass-order
fi
sizes() {  # sizes SIZE...: each generated when missing, then audited with cutlass,triton (the defaults)
    local size gen est
    for size in "$@"; do
        case $size in 0.6b) gen=20 est=30 ;; 1.7b) gen=20 est=30 ;; 8b) gen=60 est=60 ;; *) gen=80 est=60 ;; esac
        qwen3_synthetic "$size" $((gen * 3)) "$gen"
        budget "audit_$size" "$est" && audit "audit_$size" "$size" $((est * 4)) --backends cutlass,triton
    done
}
if has injection; then  # at most 180 s each: before the change one regime took 128 s at 1.7B, one run after another
    for size in $INJ_SIZES; do
        qwen3_synthetic "$size" 180 60
        budget "injection_$size" 60 && audit "injection_$size" "$size" 180 --backends cutlass,triton --phases prefill \
            --injection --injection-tokens 32
    done
fi
has sizes && sizes $SIZES
if has groups; then  # the grouped cells' A/B at 1.7B (after `sizes`): every Linear alone, the JSON compared
    export REQUANT_AUDIT_GROUPS=0
    budget audit_1.7b_alone 40 && audit audit_1.7b_alone 1.7b 160 --backends cutlass,triton
    unset REQUANT_AUDIT_GROUPS
    [ -f "$W/audit_1.7b.json" ] && [ -f "$W/audit_1.7b_alone.json" ] && step groups_equal 60 \
        python3 -m benchmarks.audit_equality --compare "$W/audit_1.7b.json" "$W/audit_1.7b_alone.json"
fi
if has tests; then
    lim=$(($(left) - 10))
    [ "$lim" -gt 240 ] && lim=240
    budget gpu_tests 60 && step gpu_tests "$lim" bash -c "python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/audit/test_batched.py tests/audit/phases/test_injection.py tests/audit/phases/test_lean_faults.py > '$W/gpu_tests.log' 2>&1; rc=\$?; \
        tail -n 5 '$W/gpu_tests.log'; exit \$rc"
fi
has sizes && sizes $EXTRA_SIZES

python3 - "$W" <<'EOF' | tee "$OUT/summary.txt"
import json
import pathlib
import sys

w = pathlib.Path(sys.argv[1])


def load(name):
    p = w / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


for name in ("pair_cutlass", "pair_triton", "faulty"):
    r = load(name)
    if r is None:
        print(f"{name}: no JSON")
        continue
    d = r.get("decode") or {}
    print(f"{name}: {' vs '.join(r['backends'])}; prefill {r['per_layer_summary']['line']}")
    for b, s in (d.get("per_layer_summary") or {}).get("by_batch", {}).items():
        print(f"  decode M={b}: {s['line']}")
    print(f"  kernel faults: prefill {r['kernel_faults']}, decode {d.get('kernel_faults')}")
    for phase, rows in (("prefill", r["baseline"]), ("decode", d.get("baseline") or [])):
        print(f"  {phase} baseline rows: " + "; ".join(
            f"{b['backend']} {b['regime']} {b['kernel_fault_cells']}/{b['cells']} breaking its order" for b in rows))
    print(f"  verdict: {r['verdict']}  wall {r['wall_seconds']} s")
print("| preset | audit wall_seconds | peak GPU memory | pow2 prefill | pow2 decode | FP/FN | stages (s) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for size in ("0.6b", "1.7b", "8b", "14b", "32b", "1.7b_alone"):
    r = load(f"audit_{size}")
    if r is None:
        continue
    d = r.get("decode") or {}
    pre, dec = r["per_layer_summary"]["pow2"], d["per_layer_summary"]["pow2"]
    peak = r.get("peak_gpu_memory_bytes")
    print(f"| {size} | {r['wall_seconds']} | {'' if peak is None else f'{peak / 2**30:.1f} GiB'} | "
          f"{pre['bitwise_equal']}/{pre['layers']} | {dec['bitwise_equal']}/{dec['layers']} | "
          f"{r['scorecard']['false_positives']}/{r['scorecard']['false_negatives']}, decode "
          f"{d['scorecard']['false_positives']}/{d['scorecard']['false_negatives']} | "
          + ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in r["timings"].items()) + " |")
for size in ("1.7b", "8b"):
    r = load(f"injection_{size}")
    if r is None:
        continue
    c = r["injection_scorecard"]
    print(f"injection {size}: scored {c['scored']}, FP {c['false_positives']} FN {c['false_negatives']}, "
          f"timings {r['timings']}")
    for fam, regs in r["injection"].items():
        print(f"  {fam}: " + "; ".join(
            f"{reg}: {m['changed_prompts']}/{m['prompts']} changed, C7 {m['c7_flagged']}/{m['tokens']} flagged"
            for reg, m in regs.items()))
EOF
cat "$TIMINGS"
cat > "$OUT/README.md" <<EOF
# Audit truth on the GPU, commit $REQUANT_COMMIT

Command: \`OUT=... STEPS="$STEPS" SIZES="$SIZES" bash benchmarks/gpu_audit_truth.sh\` (one call).
Device, torch, Triton: \`env.txt\`. Step walls and exit codes: \`timings.txt\` (pair_cutlass and pair_triton
should exit 0, faulty 1). Figures: \`summary.txt\`. Every step's log and JSON: \`truth.tgz\`.

(To be filled by the lead: what the run shows.)
EOF
tar -czf "$OUT/truth.tgz" -C "$OUT" truth && rm -rf "$W"
ls -la "$OUT"
