"""Counts what one Linear's batched evaluation dispatches (audit/batched.py), on the code path a GPU
takes, run on the CPU: torch ops, host synchronisations (item/tolist/nonzero/unique/boolean
indexing), and the bytes written by the outputs of every op. Prefill (one segment of M rows) and
decode (M = 1 and 8, 4 steps: eight segments).

    python benchmarks/audit_op_counts.py [--m 64 --k 256 --n 512]   (prints JSON)
    TRITON_INTERPRET=1 python benchmarks/audit_op_counts.py --triton-stats   (CUDA's statistics pass)

Torch ops only: a Triton launch counts as the few torch ops around it. On the CPU the F6 and exact
accumulators are the torch definitions (a loop over K tiles, float64), on CUDA one launch each.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_NO_LAUNCH = {
    "view", "detach", "unsqueeze", "select", "slice", "reshape", "expand", "_unsafe_view", "alias", "unbind",
    "t", "transpose", "split", "split_with_sizes", "randint", "lift_fresh", "_local_scalar_dense", "manual_seed",
    "set_", "empty", "_to_copy_host",
}  # fmt: skip
SYNC_OPS = {"_local_scalar_dense", "nonzero", "unique", "_unique2", "unique_dim", "masked_select", "item"}


def one_launch_acc(a, w):
    """A stand-in int32 accumulator of one op (a real one is one launch on CUDA): counts the rest."""
    return torch.zeros(a.shape[0], w.shape[0], dtype=torch.int32)


def one_launch_gemm(a, w, s_a, s_w):
    """A stand-in scaled_mm of one op (CUTLASS or Triton is one launch): counts the engine's own ops."""
    return torch.zeros(a.shape[0], w.shape[0], dtype=torch.bfloat16)


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.syncs, self.bytes, self.where = Counter(), Counter(), 0, Counter()
        self.bytes_where = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        self.ops[name] += 1
        import sys

        f = sys._getframe(1)
        while f is not None and "audit/batched.py" not in f.f_code.co_filename:
            f = f.f_back
        self.last = f.f_code.co_name if f else "?"
        self.where[self.last] += 1
        if name in SYNC_OPS or (
            name == "index" and any(getattr(t, "dtype", None) == torch.bool for t in args[1] if t is not None)
        ):
            self.syncs[name] += 1
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and name not in (
                "view",
                "detach",
                "unsqueeze",
                "select",
                "slice",
                "reshape",
                "expand",
                "_unsafe_view",
                "alias",
                "unbind",
                "t",
                "transpose",
            ):
                self.bytes += t.numel() * t.element_size()
                self.bytes_where[self.last] += t.numel() * t.element_size()
        return out


class Launches(TorchDispatchMode):
    """The torch ops that launch work (views and the like left out), host synchronisations by op,
    and the ops by the innermost calling frame whose file path holds one of `frames` ("file:function")."""

    def __init__(self, frames: tuple[str, ...] = ()):
        super().__init__()
        self.frames, self.ops, self.syncs, self.where = frames, 0, Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import sys

        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in SYNC_OPS:
            self.syncs[name] += 1
        if name in _NO_LAUNCH:
            return out
        self.ops += 1
        if self.frames:
            f = sys._getframe(1)
            while f is not None and not any(k in f.f_code.co_filename for k in self.frames):
                f = f.f_back
            self.where[f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}" if f else "?"] += 1
        return out


def main() -> None:
    from requant import kernels
    from requant.audit import batched

    try:
        from requant.audit import batched_stats
    except ImportError:  # an older tree (the statistics inside batched.py): the before figures
        batched_stats = batched
    from requant.audit.batched import Segment, evaluate_linear, resolve_all

    try:
        from requant.audit.catalogue.matrix import load_matrix, matrix_path
    except ImportError:  # an older tree (the catalogue flat in audit/): the before figures
        from requant.audit.matrix import load_matrix, matrix_path
    from requant.audit.cells import backend_kernel
    from requant.audit.records import Activations, Weights
    from requant.backends import REFERENCE_PAIR

    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--triton-stats", action="store_true", help="the CUDA statistics pass (run with TRITON_INTERPRET=1)")
    args = p.parse_args()
    batched_stats.HOST_SHORTCUTS = False  # the GPU's code path
    batched_stats.TRITON_STATS = args.triton_stats or None
    checks = load_matrix(matrix_path("v2")).checks
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (args.n, args.k), dtype=torch.int8, generator=g)
    s_w = torch.rand(args.n, 1, generator=g) * 1e-3 + 1e-4
    wt = Weights(w, s_w)
    report = {}
    for phase, ms in (("prefill", [args.m]), ("decode", [1, 1, 1, 1, 8, 8, 8, 8])):
        segs = []
        for i, m in enumerate(ms):
            a = torch.randint(-127, 128, (m, args.k), dtype=torch.int8, generator=g)
            s_a = torch.rand(m, 1, generator=g) * 1e-2 + 1e-3
            act = Activations(a, s_a)
            outs = {b: kernels.scaled_mm(a, w, s_a, s_w, backend=b) for b in REFERENCE_PAIR}
            segs.append(Segment(f"l@{i}", act, outs))
        h2d = [0]
        to_device = batched._to_device

        def counted(t, dev, _orig=to_device):
            h2d[0] += 1
            return _orig(t, dev)

        batched._to_device = counted
        with Count() as c:
            pend = evaluate_linear("native", segs, wt, REFERENCE_PAIR, backend_kernel)
            resolve_all([pend], checks)
        batched._to_device = to_device
        report[phase] = {
            "segments": len(ms),
            "ops": sum(c.ops.values()),
            # ops that launch work on a GPU: not metadata (views), not the host's seeded draws
            "kernel_ops": sum(v for k, v in c.ops.items() if k not in _NO_LAUNCH),
            "syncs": dict(c.syncs),
            "host_to_device_copies": h2d[0],
            "output_bytes_per_row_x_n": round(c.bytes / (sum(ms) * args.n), 1),
            "top_ops": dict(c.ops.most_common(8)),
            "ops_by_function": dict(c.where.most_common()),
            "output_bytes_per_row_x_n_by_function": {
                k: round(v / (sum(ms) * args.n), 1) for k, v in c.bytes_where.most_common()
            },
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
