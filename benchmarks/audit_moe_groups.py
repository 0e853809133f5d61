"""The audit's expert Linears one at a time against one group per shape (audit/cells.py LinearQueue,
REQUANT_AUDIT_GROUPS=0 / 1), on one sparse layer's routed operands: the torch ops dispatched that launch
work on a GPU (counted on the CPU, on the GPU's code path; an exact or F6 accumulator, and each run of
the pair's kernels, counted as one op, as one launch on CUDA), and the wall time of put + results; both results are compared (equal or
exit 1). Tokens are routed top-k at random (seeded) over the experts; prefill puts one operand set
per expert, decode one per (batch, step) the expert was routed at (batches 1 and 8, 4 steps).

    python -m benchmarks.audit_moe_groups [--experts 128 --top 8 --tokens 232 --k 2048 --n 768]
        [--phase prefill|decode] [--device cuda] [--json OUT]

On the CPU with small K and N the wall time is the host's own work per Linear (Python and op
dispatch), which a GPU pays besides its launches; at the real widths it is compute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from benchmarks.audit_op_counts import _NO_LAUNCH, Count


def routed_items(args, device):
    """[(expert Linear name, [(label, Activations)], Weights)] of the experts some token reached."""
    from requant.audit.records import Activations, Weights

    g = torch.Generator().manual_seed(args.seed)
    if args.phase == "prefill":
        sets = [("", args.tokens)]
    else:
        sets = [(f"@b{b}.t{t}", b) for b in (1, 8) for t in range(4)]
    picks = {label: [torch.randperm(args.experts, generator=g)[: args.top] for _ in range(m)] for label, m in sets}
    items = []
    for e in range(args.experts):
        w = torch.randint(-127, 128, (args.n, args.k), dtype=torch.int8, generator=g).to(device)
        s_w = (torch.rand(args.n, 1, generator=g) * 1e-3 + 1e-4).to(torch.bfloat16).float().to(device)
        labelled = []
        for label, _ in sets:
            m = sum(int((p == e).any()) for p in picks[label])
            if m:
                a = torch.randint(-127, 128, (m, args.k), dtype=torch.int8, generator=g).to(device)
                s_a = (torch.rand(m, 1, generator=g) * 1e-2 + 1e-3).to(device)
                labelled.append((f"model.layers.0.mlp.experts.{e}.gate_proj{label}", Activations(a, s_a)))
        if labelled:
            items.append((f"model.layers.0.mlp.experts.{e}.gate_proj", labelled, Weights(w, s_w)))
    return items


def run(items, backends, checks, device, count: bool):
    from requant.audit import batched, cells

    def once(fn, what="accumulator"):  # an accumulator (or the pair's kernel): one launch on CUDA, one op
        def wrapped(*a, **kw):
            if c is not None:
                c.ops[what] += 1
                with c.paused():
                    return fn(*a, **kw)
            return fn(*a, **kw)

        return wrapped

    saved = batched.exact_accumulate, batched.f6_accumulator, cells.kernels.scaled_mm
    batched.exact_accumulate, batched.f6_accumulator = once(saved[0]), once(saved[1])
    cells.kernels.scaled_mm = once(saved[2], "pair_kernel")
    c = _Counting() if count else None
    try:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with c if c is not None else _nothing():
            q = cells.LinearQueue("native", backends, checks)
            for key, labelled, wt in items:
                q.put(key, labelled, wt)
            res = q.results()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return res, time.perf_counter() - t0, c
    finally:
        batched.exact_accumulate, batched.f6_accumulator, cells.kernels.scaled_mm = saved


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _Counting(Count):
    """Count, with a pause (the accumulators' inner ops are not counted)."""

    def paused(self):
        from torch.utils._python_dispatch import _pop_mode_temporarily

        return _pop_mode_temporarily()


def main() -> int:
    from requant.audit import batched_stats
    from requant.audit.catalogue.matrix import load_matrix, matrix_path
    from requant.audit.cells import GROUPS_ENV
    from requant.backends import REFERENCE_PAIR

    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--tokens", type=int, default=232)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=768)
    p.add_argument("--phase", choices=("prefill", "decode"), default="prefill")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # a loaded CPU: spinning intra-op threads cost more than they give
    device = torch.device(args.device)
    if device.type == "cpu":
        batched_stats.HOST_SHORTCUTS = False  # the GPU's code path
    checks = load_matrix(matrix_path("v2")).checks
    items = routed_items(args, device)
    report = {"args": vars(args), "linears": len(items), "operand_sets": sum(len(lab) for _, lab, _ in items)}
    results = {}
    for groups in ("0", "1"):
        os.environ[GROUPS_ENV] = groups
        res, _, c = run(items, REFERENCE_PAIR, checks, device, count=device.type == "cpu")
        _, wall, _ = run(items, REFERENCE_PAIR, checks, device, count=False)  # timed without the counting
        results[groups] = res
        report["grouped" if groups == "1" else "alone"] = {
            "wall_s": round(wall, 3),
            **({"kernel_ops": sum(v for k, v in c.ops.items() if k not in _NO_LAUNCH)} if c is not None else {}),
        }
    report["equal"] = results["0"] == results["1"]
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
