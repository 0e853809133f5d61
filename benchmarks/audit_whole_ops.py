"""A whole audit's launching torch ops with every Linear evaluated alone (REQUANT_AUDIT_GROUPS=0) and
with Linears of one weight shape grouped (dense ones too: cells.DENSE_GROUPS = True, as on CUDA), on
the GPU's code path run on the CPU (batched_stats.HOST_SHORTCUTS = False): prefill cells, decode
cells, captures (both backends' prefills and decode steps) and the rest, as JSON; the two audits'
JSON must be equal but for timings (exit 1 otherwise).

    python -m benchmarks.audit_whole_ops [CKPT] [--prompts 8] [--decode-steps 4] [--json OUT]
    python -m benchmarks.audit_whole_ops --synthetic-layers 28   (a synthetic Qwen3 of the embedded
        default's widths, hidden 256, intermediate 768, with that many layers, written to a temp dir)

`ops`: torch ops that launch work (benchmarks.audit_op_counts.Launches: views and host draws left
out), as the CPU dispatches them. `launches`: the same with each exact or F6 accumulator and each
call of a scaled_mm kernel counted as one op (one launch each on CUDA: cuBLASLt, the F6 Triton
kernel, CUTLASS or Triton; on the CPU they are torch definitions of several ops).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter

from benchmarks.audit_op_counts import Launches

FRAMES = ("audit/phases/", "audit/suite.py")
CELLS = {"prefill.py:cells": "prefill_cells", "decode.py:run": "decode_cells"}
CAPTURES = ("prefill.py:capture", "decode.py:decode_operands", "decode.py:decode_logits", "decode.py:_cache_for")


class _Counted:
    """Launches, where a wrapped call (an accumulator, a kernel) also counts as one launch."""

    def __init__(self):
        self.c = Launches(frames=FRAMES)
        self.inner, self.calls = Counter(), Counter()

    def wrap(self, fn):
        def wrapped(*a, **kw):
            before = Counter(self.c.where)
            out = fn(*a, **kw)
            delta = Counter(self.c.where)
            delta.subtract(before)
            delta = +delta
            if delta:  # every inner op has the caller's frame: one launch there
                self.inner.update(delta)
                self.calls[next(iter(delta))] += 1
            return out

        return wrapped


def _buckets(where: Counter) -> dict:
    out = {"prefill_cells": 0, "decode_cells": 0, "captures": 0, "other": 0}
    for frame, n in where.items():
        key = CELLS.get(frame) or ("captures" if frame in CAPTURES else "other")
        out[key] += n
    return {**out, "total": sum(where.values())}


def count_audit(ckpt, prompts: int, decode_steps: int, grouped: bool) -> tuple[dict, dict]:
    """(the audit's result, its op counts) with grouping on or off."""
    from requant import kernels
    from requant.audit import batched, batched_stats, cells
    from requant.audit.suite import run_audit
    from requant.backends import REFERENCE_PAIR

    env = os.environ.get(cells.GROUPS_ENV)
    os.environ[cells.GROUPS_ENV] = "1" if grouped else "0"
    counted = _Counted()
    saved = (batched.exact_accumulate, batched.f6_accumulator, kernels.scaled_mm, batched_stats.HOST_SHORTCUTS)
    saved_dense = cells.DENSE_GROUPS
    batched.exact_accumulate, batched.f6_accumulator = counted.wrap(saved[0]), counted.wrap(saved[1])
    kernels.scaled_mm = counted.wrap(saved[2])
    batched_stats.HOST_SHORTCUTS, cells.DENSE_GROUPS = False, True  # the GPU's code path, CUDA's grouping
    try:
        with counted.c:
            res = run_audit(
                ckpt, REFERENCE_PAIR, prompts, "cpu", phases=("prefill", "decode"), keep_cells="all",
                decode_steps=decode_steps,
            )  # fmt: skip
    finally:
        batched.exact_accumulate, batched.f6_accumulator, kernels.scaled_mm, batched_stats.HOST_SHORTCUTS = saved
        cells.DENSE_GROUPS = saved_dense
        if env is None:
            os.environ.pop(cells.GROUPS_ENV)
        else:
            os.environ[cells.GROUPS_ENV] = env
    launches = Counter(counted.c.where)
    launches.subtract(counted.inner)
    launches.update(counted.calls)
    return res, {"ops": _buckets(counted.c.where), "launches": _buckets(+launches)}


def synthetic(layers: int, out: str) -> str:
    from requant.checkpoint.synthetic import PRESETS, generate

    tiny = PRESETS["tiny"]
    p = type(tiny)(256, 768, layers, 4, 2, 64, tiny.vocab, False, tiny.max_position, tiny.bos, tiny.eos)
    return str(generate(p, out))


def main(argv=None) -> int:
    from benchmarks.audit_equality import _strip, first_difference
    from requant import DEFAULT_CHECKPOINT
    from requant.checkpoint import open_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", nargs="?", help="a W8A8 checkpoint (default: the embedded default)")
    ap.add_argument("--synthetic-layers", type=int, help="a synthetic checkpoint of this many layers instead")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--decode-steps", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.ckpt or DEFAULT_CHECKPOINT
        if args.synthetic_layers:
            path = synthetic(args.synthetic_layers, os.path.join(tmp, "synthetic"))
        ckpt = open_checkpoint(path)
        layers = ckpt.config["num_hidden_layers"]
        report = {"checkpoint": "synthetic" if args.synthetic_layers else str(path), "layers": layers}
        report.update({"prompts": args.prompts, "decode_steps": args.decode_steps, "pair": "reference"})
        results = {}
        for name, grouped in (("alone", False), ("grouped", True)):
            results[name], report[name] = count_audit(ckpt, args.prompts, args.decode_steps, grouped)
    # git_commit is where the code came from, not a result: a tree edited between the two audits
    # (minutes apart at 28 layers) marks one side "-dirty"
    alone, grouped = ({k: v for k, v in _strip(results[n]).items() if k != "git_commit"} for n in ("alone", "grouped"))
    diff = first_difference(alone, grouped)
    report["equal"] = diff is None
    if diff is not None:
        report["first_difference"] = diff
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
