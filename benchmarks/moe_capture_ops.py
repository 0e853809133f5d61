"""Counts what the reference engine dispatches while the audit's decode phase captures a Qwen3-MoE
model (audit/phases/decode.decode_operands: prefill, then greedy steps), run on the CPU: torch ops
that launch work (views and the like left out) and host synchronisations. The GEMM is a stand-in
of one launch (a real CUTLASS or Triton kernel is one), so the count is the engine's own: routing,
quantization, gathers, the combine. A synthetic checkpoint at small widths with the 30B-A3B's
routing (128 experts, top 8) is made in a temporary folder.

    python -m benchmarks.moe_capture_ops [--batch 8 --steps 4 --layers 2]   (prints JSON)

On the CPU the count of `_local_scalar_dense` includes the finiteness check every CPU
quantization makes (kernels/reference._check_activations); a CUDA tensor skips it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile

import torch

from benchmarks.audit_op_counts import Launches, one_launch_gemm
from requant import kernels
from requant.audit.phases.decode import batch_prompts, decode_operands
from requant.checkpoint.synthetic import PRESETS, generate
from requant.runtime import load_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    preset = dataclasses.replace(
        PRESETS["tiny-moe"], experts=128, top_k=8, moe_intermediate=128, mlp_only_layers=(), layers=args.layers
    )
    with tempfile.TemporaryDirectory() as d:
        generate(preset, d)
        gemm = kernels.ScaledMM("one-launch", one_launch_gemm, "triton-order")
        model = load_model(d, regime="pow2", engine="reference").with_backends(gemm)
        prompts = batch_prompts([list(range(1, 6 + i)) for i in range(8)], args.batch)
        count = Launches()
        with count, torch.no_grad():
            decode_operands(model, prompts, args.steps)
    report = {
        "preset": {"experts": preset.experts, "top_k": preset.top_k, "layers": preset.layers},
        "batch": args.batch,
        "steps": args.steps,
        "launching_ops": count.ops,
        "host_syncs": dict(count.syncs),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
