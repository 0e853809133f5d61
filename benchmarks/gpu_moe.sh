#!/usr/bin/env bash
# Qwen3-MoE on the GPU: the qwen3-30b-a3b synthetic checkpoint (the published Qwen3-30B-A3B config,
# random weights with outlier channels, 128 experts, top 8; ~31 GB W8A8) made, inspected, audited
# (the real pair, cutlass and triton, each expert on the tokens the router sends it) and generated
# from on each kernel, pow2 and native, with the records replayed across kernels and batch sizes.
# Run from anywhere on the GPU machine (one H100/H200, no network), the repo's wheels installed:
#
#     REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) OUT=/some/dir bash benchmarks/gpu_moe.sh
#
# LAYERS (default 4): the first 4 decoder layers at the real widths (every Linear shape of the model,
# 1,552 quantized Linears, 512 experts); LAYERS=0 makes all 48 (18,624 Linears, ~31 GB). The audit
# evaluates a layer's expert Linears of one shape as one group (docs/audit.md, "Expert Linears in
# groups"; one at a time it took 77.8 s for 4 layers on an H100, ~15 min for 48).
# STEPS (default "generate inspect plan audit run"): generate writes the checkpoint to $CKPT_DIR (default
# /tmp/requant-qwen3-30b-a3b-4l-synthetic; kept between calls on a warm machine); inspect and plan
# run `requant inspect --json` and `requant audit --plan` (17 s and 3 s at 48 layers); audit runs
# `requant audit` (prefill and decode) on it; run generates and replays.
# "fast" (not in the default): benchmarks/bench_moe_fast.py (the fast engine: alone == batched, chunks ==
# decode, pow2 CUTLASS == Triton, its distance and speed against the reference engine; fast.json) and
# the audit of triton against vLLM's fused-MoE order (reference-vllm-moe-order; audit_vllm.json: its
# moe_combine rows are expected unequal, exit 1, docs/moe.md).
# "groups" (not in the default; the audit-time goal, docs/moe.md): the audit's expert Linears evaluated one at a time
# against one group per shape, on one layer's routed operands at the real widths
# (benchmarks/audit_moe_groups.py, groups_prefill.json, groups_decode.json: wall time, results equal),
# and the whole audit again with REQUANT_AUDIT_GROUPS=0 (audit_alone.json: its wall time beside the audit
# step's; the two JSONs compared, equal but for timings: audit_ab.txt). Run after "audit":
#     STEPS="generate audit groups" (about 2 x the audit's time).
# "convert" (not in the default) also writes the nearest-arm conversion next to it: another ~31 GB,
# which does not fit a 64 GiB disk beside the checkpoint and the pip cache; run it on a larger disk.
# PRESET=tiny-moe runs every step in seconds (a smoke test of this script; BACKENDS=reference on a CPU).
# Writes into $OUT: env.txt, timings.txt, fast.json, audit_ab.txt, groups_*.json and moe.tgz (inspect.json, audit.json, audit/
# (report), audit.log, generate_*.jsonl and their replay logs, audit_vllm.*). The audit and replay exit 1 on a difference: a result to
# report, recorded in timings.txt; the script goes on. The MoE layers run on the reference engine
# here (runtime/moe.py; the fast engine only in step "fast"), one launch per expert and Linear: generation is
# slow (NEW_TOKENS, default 4); the point is the bits. Over 10 minutes in all: split the calls with
# STEPS (generate; audit; run).
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out
PRESET="${PRESET:-qwen3-30b-a3b}"
LAYERS="${LAYERS:-4}"                   # the preset's first LAYERS layers (0: all 48)
CKPT="${CKPT_DIR:-/tmp/requant-$PRESET-${LAYERS}l-synthetic}"
PROMPTS="${PROMPTS:-8}"
BACKENDS="${BACKENDS:-cutlass,triton}"
STEPS="${STEPS-generate inspect plan audit run}"
TIMINGS="$OUT/timings.txt"
: > "$TIMINGS"
DEV=cuda
[ "$BACKENDS" = reference ] && DEV=cpu

carried_wheels || exit 1  # nvidia-cutlass for the cutlass backend
gpu_env triton > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
[ "$BACKENDS" != reference ] && cutlass_build 0

if has generate && [ ! -f "$CKPT/config.json" ]; then
    step "synthetic_$PRESET" 0 python3 -c "
import dataclasses
from requant.checkpoint.synthetic import PRESETS, generate
p = PRESETS['$PRESET']
p = dataclasses.replace(p, layers=$LAYERS) if $LAYERS else p
print(generate(p, '$CKPT', device='$DEV', shard_size=5_000_000_000))"
fi
has inspect && step inspect 600 bash -c "python3 cli.py inspect '$CKPT' --json > '$OUT/inspect.json'"
has plan && step plan 120 python3 cli.py audit "$CKPT" --plan

if has audit; then
    step audit 0 bash -c "python3 cli.py audit '$CKPT' --byte-tokens --phases ${PHASES:-prefill,decode} --backends $BACKENDS --prompts $PROMPTS --device $DEV \
        --json '$OUT/audit.json' --report '$OUT/audit' > '$OUT/audit.log' 2>&1; rc=\$?; tail -n 30 '$OUT/audit.log'; exit \$rc"
fi

if has run; then
    first=${BACKENDS%%,*}
    second=${BACKENDS##*,}
    for regime in pow2 native; do
        rec="$OUT/generate_${regime}_$first.jsonl"
        step "generate_${regime}_$first" 0 python3 cli.py generate "$CKPT" --regime "$regime" --backend "$first" \
            --device "$DEV" --engine reference --max-new-tokens "${NEW_TOKENS:-4}" --no-eos --byte-tokens \
            --prompt "The experts of a mixture" --prompt "A router sends each token to eight experts, and" \
            --prompt "Power-of-two scales" --json "$rec"
        # the other kernel, batched with fillers: pow2 must match bit for bit; native is measured
        step "replay_${regime}_$second" 0 bash -c "python3 cli.py replay '$rec' --backend $second --device $DEV --byte-tokens \
            > '$OUT/replay_${regime}_$second.log' 2>&1; rc=\$?; tail -n 8 '$OUT/replay_${regime}_$second.log'; exit \$rc"
    done
fi

if has fast; then  # the fast engine on the MoE checkpoint (runtime/fast_moe.py), and vLLM's fused-MoE order audited
    step fast 0 python3 benchmarks/bench_moe_fast.py "$CKPT" --json "$OUT/fast.json" --tokens "${NEW_TOKENS:-4}"
    step audit_vllm_order 0 bash -c "python3 cli.py audit '$CKPT' --byte-tokens --phases ${PHASES:-prefill,decode} --backends triton,reference-vllm-moe-order \
        --prompts $PROMPTS --device $DEV --json '$OUT/audit_vllm.json' > '$OUT/audit_vllm.log' 2>&1; rc=\$?; \
        tail -n 12 '$OUT/audit_vllm.log'; exit \$rc"
fi

if has groups; then  # expert Linears alone vs grouped: speed, and the same JSON
    for ph in prefill decode; do
        step "groups_$ph" 300 python3 -m benchmarks.audit_moe_groups --phase "$ph" --device "$DEV" --tokens 480 ${GROUPS_ARGS:-} \
            --json "$OUT/groups_$ph.json"
    done
    step audit_alone 0 bash -c "REQUANT_AUDIT_GROUPS=0 python3 cli.py audit '$CKPT' --byte-tokens --phases ${PHASES:-prefill,decode} \
        --backends $BACKENDS --prompts $PROMPTS --device $DEV --json '$OUT/audit_alone.json' > '$OUT/audit_alone.log' 2>&1; \
        rc=\$?; tail -n 4 '$OUT/audit_alone.log'; exit \$rc"
    step audit_ab 60 bash -c "python3 -m benchmarks.audit_equality --compare '$OUT/audit.json' '$OUT/audit_alone.json' \
        > '$OUT/audit_ab.txt' 2>&1; rc=\$?; cat '$OUT/audit_ab.txt'; exit \$rc"
fi

if has convert; then
    step convert_nearest 0 python3 cli.py convert "$CKPT" -o "$CKPT-nearest" --arm nearest -q --json "$OUT/convert.json"
    step verify_unconstrained_roundtrip 0 bash -c "python3 cli.py convert '$CKPT' -o '$CKPT-u' --arm unconstrained -q \
        && python3 cli.py verify '$CKPT' '$CKPT-u'; rc=\$?; rm -rf '$CKPT-u'; exit \$rc"
fi
echo "total $(elapsed) s"
# The device returns at most 8 files from $OUT: keep the summaries, pack the rest (reports, logs,
# records, JSON) into moe.tgz.
(cd "$OUT" && find . -type f ! -name env.txt ! -name timings.txt ! -name fast.json ! -name audit_ab.txt ! -name 'groups_*.json' ! -name moe.tgz -print0 \
    | tar --null -czf moe.tgz -T - --remove-files && find . -mindepth 1 -type d -empty -delete)
