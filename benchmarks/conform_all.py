"""Fingerprint every registered backend that runs here and every catalogue fault wrapped as a
kernel (audit/conform/fault_kernels.py), in one process, on one device; check each identification
against what the kernel is known to compute (kernels.EMULATION_OF for backends, FAULT_FORMULAS
for faults, both written from the definitions, not from a run).

    python3 -m benchmarks.conform_all [--device cuda] [--json OUT]

Exit 0 when every kernel is identified as expected; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from requant.audit import conform as C
from requant.audit.conform import fault_kernels as FK
from requant.audit.conform import vectors as V
from requant.backends import environment


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    backends = ["reference", "reference-cutlass-order", "reference-triton-order", "reference-fused-order", "cublas"]
    if args.device.startswith("cuda"):
        backends += ["triton"] + (["cutlass"] if torch.cuda.get_device_capability() == (9, 0) else [])
    vs = V.build_vectors()
    rows, ok_all = [], True
    for name, fn, want in [(b, C.resolve_kernel(b, None)[1], ("exact", C.declared_order(b))) for b in backends] + [
        (f"fault {k}", fn, FK.FAULT_FORMULAS[k]) for k, fn in FK.FAULTS.items()
    ]:
        t0 = time.perf_counter()
        declared = C.declared_order(name) if name in backends else None
        r = C.fingerprint(name, C.run_cases(name, fn, vs, args.device), vs, declared)
        if want is None:
            ok = not r["identified"]
        else:
            ok = r["identified"] and r["accumulator"] == want[0] and want[1] in r["formulas_agreeing"]
        ok_all &= ok
        print(
            f"{'ok ' if ok else 'BAD'} {name}: {r['verdict']}  [exit {0 if r['conforms'] else 1}, "
            f"{time.perf_counter() - t0:.2f} s]",
            flush=True,
        )
        rows.append(
            {
                "kernel": name,
                "expected": want,
                "as_expected": ok,
                "conforms": r["conforms"],
                "verdict": r["verdict"],
                "formula": r["formula"],
                "accumulator": r["accumulator"],
                "formulas_agreeing": r["formulas_agreeing"],
                "batch_invariant": r["batch"]["invariant"],
                "declared": declared,
                "declared_confirmed": r["declared_confirmed"],
            }
        )
    doc = {
        "tool": "benchmarks/conform_all.py",
        "device": args.device,
        "vectors_sha256": vs.digest(),
        "vectors_pinned": vs.digest() == V.PINNED_SHA256,
        "all_as_expected": ok_all,
        "kernels": rows,
        "environment": environment(args.device),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(f"all as expected: {ok_all}; vectors pinned: {doc['vectors_pinned']}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
