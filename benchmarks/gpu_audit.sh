#!/usr/bin/env bash
# GPU measurements for the audit: the real pair (cutlass, triton) on a
# Qwen3-1.7B-shaped synthetic checkpoint (random weights with outlier channels, the real
# config) and on the embedded default. Run from anywhere on the GPU machine (one H200, no
# network), with the repo's wheels already installed:
#
#     OUT=/some/dir bash benchmarks/gpu_audit.sh
#
# The device machine gets the working tree without .git: pass the commit along, e.g.
#     REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) OUT=/some/dir bash benchmarks/gpu_audit.sh
# (env.txt records it; benchmarks/commit_id.sh says how).
# Writes into $OUT: env.txt, timings.txt (each step's wall time and exit status), and per
# checkpoint audit_<name>.json, audit_<name>/ (JSON, Markdown, PNG plots) and audit_<name>.log.
# Expected total time: CUTLASS JIT build (a few minutes on a cold cache; $REQUANT_CUTLASS_CACHE,
# default ~/.cache/requant/cutlass, is reused when warm) + synthetic checkpoint (~1 min) + the two audits (goal: the 8,232-cell suite in under 5 minutes).
# The audit exits 1 when the scorecard has a false positive/negative or a pow2 layer
# differs: that is a result to report, so the script records each exit status and goes on.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
PRESET="${PRESET:-qwen3-1.7b}"          # requant.checkpoint.synthetic preset (tiny: a quick smoke test)
CKPT="${CKPT_DIR:-/tmp/requant-$PRESET-synthetic}"
PROMPTS="${PROMPTS:-8}"
BACKENDS="${BACKENDS:-cutlass,triton}"   # 'reference' for a CPU smoke test of this script
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"

gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "$BACKENDS" != reference ]; then  # the real pair needs the GPU: build and warm up first
    cutlass_build 0
    step triton_warmup 0 python3 -c "
import torch
from requant import kernels
a = torch.randint(-128, 128, (64, 256), dtype=torch.int8, device='cuda'); w = torch.randint(-128, 128, (128, 256), dtype=torch.int8, device='cuda')
s = torch.ones(64, 1, device='cuda'); t = torch.ones(128, 1, device='cuda')
print('triton ok', kernels.scaled_mm(a, w, s, t, backend='triton').shape)"
fi

if [ ! -f "$CKPT/config.json" ]; then
    step "synthetic_$PRESET" 0 python3 -m requant.checkpoint.synthetic "$PRESET" "$CKPT"
fi
step "plan_$PRESET" 0 python3 cli.py audit "$CKPT" --plan

step "audit_$PRESET" 0 bash -c "python3 cli.py audit '$CKPT' --backends $BACKENDS --prompts $PROMPTS \
    --json '$OUT/audit_$PRESET.json' --report '$OUT/audit_$PRESET' > '$OUT/audit_$PRESET.log' 2>&1; rc=\$?; tail -n 30 '$OUT/audit_$PRESET.log'; exit \$rc"

step audit_default 0 bash -c "python3 cli.py audit --backends $BACKENDS --prompts $PROMPTS \
    --json '$OUT/audit_default.json' --report '$OUT/audit_default' > '$OUT/audit_default.log' 2>&1; rc=\$?; tail -n 30 '$OUT/audit_default.log'; exit \$rc"

# The reference pair on the same GPU, for comparison with the CPU result in the README.
step audit_default_reference 0 bash -c "python3 cli.py audit --backends reference --prompts $PROMPTS \
    --json '$OUT/audit_default_reference.json' > '$OUT/audit_default_reference.log' 2>&1; rc=\$?; tail -n 8 '$OUT/audit_default_reference.log'; exit \$rc"

python3 - "$OUT" "$PRESET" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in (sys.argv[2], "default", "default_reference"):
    p = out / f"audit_{name}.json"
    if not p.exists():
        print(f"{name}: no JSON (see the log)")
        continue
    r = json.loads(p.read_text())
    c = r["scorecard"]
    print(f"{name}: cells={r['cells']} layers={r['layers']} {r['per_layer_summary']['line']} "
          f"FP={c['false_positives']} FN={c['false_negatives']} wall={r['wall_seconds']}s timings={r['timings']}")
EOF
cat "$TIMINGS"
