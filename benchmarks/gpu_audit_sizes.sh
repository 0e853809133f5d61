#!/usr/bin/env bash
# The audit's cost curve on one H200: `requant audit CKPT --backends cutlass,triton --byte-tokens`
# (the defaults: prefill and decode at M = 1 and 8, 4 steps, 21 variants, 8 checks) on the
# Qwen3-0.6B, 1.7B, 8B, 14B and 32B-shaped synthetics, then the batched path against the per-cell
# path cell by cell (1.7B; one decode step of 14B), and `--injection` (32 tokens) at 1.7B and 8B.
# From the repository root on the GPU machine:
#
#     OUT=/some/dir bash benchmarks/gpu_audit_sizes.sh
#
# STEPS (default "build generate audit equality injection") picks the steps; SIZES (default
# "0.6b 1.7b 8b 14b 32b") the presets generated and audited; EQ_SIZES (default "1.7b 14b") where the
# batched path is checked against the per-cell one; INJ_SIZES (default "8b 1.7b") where the
# injection runs; TOTAL_S (default 540) the budget: a step that would start with less than its
# estimate left is skipped (the summary says so). Checkpoints are made on the GPU (python -m
# requant.checkpoint.synthetic --device cuda, 4 GB shards) under $CKPT_ROOT (default /tmp) and reused when
# present; the 32B one (~33 GB) is made last, after removing the sizes not in SIZES while fewer than
# 40 GB are free (a 64 GiB disk does not hold all five). One call may not hold everything in 10
# minutes; three that do (the machine kept warm between them, checkpoints reused):
#     STEPS="build generate audit equality" SIZES="0.6b 1.7b 8b 14b"
#     STEPS="build equality injection" SIZES="" EQ_SIZES="14b"   (EQ_SIZES: what the first call skipped)
#     STEPS="build generate audit" SIZES="32b" EQ_SIZES="" INJ_SIZES=""
# Files in $OUT: env.txt, timings.txt, audit_<preset>.json and .log (and time_<preset>.txt from
# /usr/bin/time -v where it exists), equality_<preset>.json and .log, injection_<preset>.json and
# .log, summary.txt (the table).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
carried_wheels || exit 1
STEPS="${STEPS-build generate audit equality injection}"
SIZES="${SIZES-0.6b 1.7b 8b 14b 32b}"
TOTAL_S="${TOTAL_S:-540}"
CKPT_ROOT="${CKPT_ROOT:-/tmp}"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -v -o)
free_gb() { df -Pk "$CKPT_ROOT" | awk 'NR == 2 {print int($4 / 1048576)}'; }
audit_size() {  # audit_size SIZE LIMIT_S
    local d t=()
    d=$(qwen3_ckpt "$1")
    [ -f "$d/config.json" ] || { skip "audit_$1" "no checkpoint $d"; return 0; }
    [ ${#TIME[@]} -gt 0 ] && t=("${TIME[@]}" "$OUT/time_$1.txt")
    step "audit_$1" "$2" bash -c "${t[*]} python3 cli.py audit '$d' --backends cutlass,triton --byte-tokens \
        --json '$OUT/audit_$1.json' > '$OUT/audit_$1.log' 2>&1; rc=\$?; tail -n 12 '$OUT/audit_$1.log'; exit \$rc"
}

if has build; then
    cutlass_build 300
    step triton_warmup 120 python3 -c "
import torch
from requant import kernels
a = torch.randint(-128, 128, (64, 256), dtype=torch.int8, device='cuda'); w = torch.randint(-128, 128, (128, 256), dtype=torch.int8, device='cuda')
s = torch.ones(64, 1, device='cuda'); t = torch.ones(128, 1, device='cuda')
print('triton ok', kernels.scaled_mm(a, w, s, t, backend='triton').shape)"
fi

SMALL=""
for size in $SIZES; do [ "$size" != 32b ] && SMALL="$SMALL $size"; done
for size in $SMALL; do qwen3_synthetic "$size" 240; done
if has audit; then
    for size in $SMALL; do
        case $size in 0.6b) est=20 ;; 1.7b) est=25 ;; 8b) est=40 ;; *) est=60 ;; esac
        budget "audit_$size" "$est" && audit_size "$size" 300
    done
fi
in_sizes() { case " $SIZES " in *" $1 "*) return 0 ;; esac; return 1; }
if has equality; then
    for size in ${EQ_SIZES-1.7b 14b}; do
        [ -f "$(qwen3_ckpt "$size")/config.json" ] || { skip "equality_$size" "no checkpoint"; continue; }
        budget "equality_$size" "$([ "$size" = 14b ] && echo 200 || echo 90)" || continue
        step "equality_$size" 420 bash -c "python3 -m benchmarks.audit_equality '$(qwen3_ckpt "$size")' --decode-tokens 1 \
            --json '$OUT/equality_$size.json' > '$OUT/equality_$size.log' 2>&1; rc=\$?; tail -n 3 '$OUT/equality_$size.log'; exit \$rc"
    done
fi
if has injection; then
    for size in ${INJ_SIZES-8b 1.7b}; do
        d=$(qwen3_ckpt "$size")
        [ -f "$d/config.json" ] || { skip "injection_$size" "no checkpoint"; continue; }
        budget "injection_$size" "$([ "$size" = 8b ] && echo 150 || echo 60)" || continue
        step "injection_$size" 420 bash -c "python3 cli.py audit '$d' --backends cutlass,triton --byte-tokens \
            --phases prefill --injection --injection-tokens 32 --json '$OUT/injection_$size.json' \
            > '$OUT/injection_$size.log' 2>&1; rc=\$?; tail -n 16 '$OUT/injection_$size.log'; exit \$rc"
    done
fi
if in_sizes 32b; then
    d32=$(qwen3_ckpt 32b)
    if [ ! -f "$d32/config.json" ] && has generate; then
        for other in 14b 8b 1.7b 0.6b; do  # the disk (64 GiB) does not hold every size at once
            [ "$(free_gb)" -ge 40 ] && break
            in_sizes "$other" && continue
            [ -d "$(qwen3_ckpt "$other")" ] && echo "disk: $(free_gb) GB free; removing $(qwen3_ckpt "$other")" && rm -rf "$(qwen3_ckpt "$other")"
        done
    fi
    budget synthetic_32b 60 && qwen3_synthetic 32b 300
    has audit && budget audit_32b 90 && audit_size 32b 420
fi

python3 - "$OUT" 0.6b 1.7b 8b 14b 32b <<'EOF' | tee "$OUT/summary.txt"
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
steps = {}
for line in (out / "timings.txt").read_text().splitlines():
    parts = line.split()
    if len(parts) > 4 and parts[0] == "==":
        steps[parts[1]] = " ".join(parts[2:5]) if parts[3] == "s" else "skipped"
def stages(t):
    return ", ".join(f"{k[:-2] if k.endswith('_s') else k} {v}" for k, v in t.items())


print("| preset | step wall | audit wall_seconds | peak GPU memory | cells (prefill + decode) | pow2 prefill | pow2 decode | FP/FN | stages (s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for size in sys.argv[2:]:
    p = out / f"audit_{size}.json"
    if not p.exists():
        print(f"| {size} | {steps.get(f'audit_{size}', 'not run')} | | | | | | | |")
        continue
    r = json.loads(p.read_text())
    d = r.get("decode") or {}
    peak = r.get("peak_gpu_memory_bytes")
    fpfn = f"{r['scorecard']['false_positives']}/{r['scorecard']['false_negatives']}"
    if d:
        fpfn += f", decode {d['scorecard']['false_positives']}/{d['scorecard']['false_negatives']}"
    pre, dec = r["per_layer_summary"]["pow2"], (d.get("per_layer_summary") or {}).get("pow2", {})
    print(
        f"| {size} | {steps.get(f'audit_{size}', '?')} | {r['wall_seconds']} | "
        f"{'' if peak is None else f'{peak / 2**30:.1f} GiB'} | {r['cells']} + {d.get('cells', 0)} | "
        f"{pre['bitwise_equal']}/{pre['layers']} | {dec.get('bitwise_equal', '')}/{dec.get('layers', '')} | {fpfn} | "
        f"{stages(r['timings'])} |"
    )
for size in sys.argv[2:]:
    p = out / f"equality_{size}.json"
    if p.exists():
        e = json.loads(p.read_text())
        print(f"equality {size}: {'EQUAL' if e['equal'] else 'DIFFERENT: ' + str(e['first_difference'])}, "
              f"{e['cell_rows']} cell rows, walls {e['walls']}")
for size in sys.argv[2:]:
    p = out / f"injection_{size}.json"
    if p.exists():
        r = json.loads(p.read_text())
        c = r["injection_scorecard"]
        print(f"injection {size}: {steps.get(f'injection_{size}', '?')}, scored {c['scored']}, "
              f"FP {c['false_positives']} FN {c['false_negatives']}, timings {r['timings']}")
        for fam, regs in r["injection"].items():
            print(f"  {fam}: " + "; ".join(
                f"{reg}: {m['changed_prompts']}/{m['prompts']} changed, {m['c7_flagged']}/{m['tokens']} flagged, "
                f"max dev {m['logit_max_abs']:.3g} (one layer {m['one_layer']['changed_prompts']}, "
                f"{m['one_layer']['c7_flagged']}, {m['one_layer']['logit_max_abs']:.3g})" for reg, m in regs.items()))
EOF
cat "$TIMINGS"
