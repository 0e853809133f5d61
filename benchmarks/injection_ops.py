"""Counts what the audit's batched injection dispatches for one regime (audit/phases/injection.py,
run_injection with batched=True, the path CUDA takes), run on the CPU: torch ops that launch work
(views and the like left out), by the frame that issued them. The GEMMs are one-launch stand-ins
(the exact accumulator, F6's and the base kernel are each one launch on CUDA), so the count is the
injector's and the reference engine's own. The model is a synthetic of 1.7B's depth (28 layers) at
small widths, made in a temporary folder; 8 prompts, as the audit.

    python -m benchmarks.injection_ops [--layers 28 --tokens 32]   (prints JSON)

The batched injection on a GPU is bound by this dispatch (its stage costs about the same at the
1.7B and 8B shapes: benchmarks/results/audit_truth_gpu/784aba0/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile

from benchmarks.audit_op_counts import Launches, one_launch_acc, one_launch_gemm
from requant import kernels
from requant.audit.phases import injection
from requant.audit.phases.lean_faults import lean_faults
from requant.checkpoint.synthetic import PRESETS, generate
from requant.runtime import load_model

_FRAMES = ("audit/phases/", "runtime/reference.py", "kernels/ops.py", "kernels/reference.py")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    base = kernels.ScaledMM("one-launch", one_launch_gemm, "triton-order")
    # The stand-ins are built-ins to the injector (a registered base), as cutlass and triton are.
    registered = kernels.scaled_mm_backends
    kernels.scaled_mm_backends = lambda: [*registered(), str(base)]
    injection.device_faults = lambda device: lean_faults(one_launch_acc, one_launch_acc)
    injection.exact_accumulate = one_launch_acc
    preset = dataclasses.replace(PRESETS["tiny"], layers=args.layers)
    prompts = [list(range(1, 6 + i)) for i in range(8)]
    with tempfile.TemporaryDirectory() as d:
        generate(preset, d)
        model = load_model(d, regime="pow2", engine="reference")
        count = Launches(_FRAMES)
        with count:
            injection.run_injection(model, prompts, (base, base), tokens=args.tokens, batched=True)
    report = {
        "layers": args.layers,
        "tokens": args.tokens,
        "prompts": len(prompts),
        "launching_ops": count.ops,
        "by_frame": dict(count.where.most_common()),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
