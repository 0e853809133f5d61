"""The audit's batched path against its per-cell path (REQUANT_AUDIT_PER_CELL=1, the oracle), cell by
cell, on one checkpoint: both runs of requant.audit.suite.run_audit keep every cell row, prefill and
decode (keep_cells="all"), and every key of the two results is compared except wall times and peak
memory. Prints one line per run and "equal" or the first differing key; exit 0 when equal, 1 otherwise.

    python3 -m benchmarks.audit_equality CKPT [--backends cutlass,triton] [--order ORDER] [--matrix v2] [--prompts 8]
        [--decode-batches 1,8] [--decode-tokens 1] [--device cuda] [--json OUT]
    python3 -m benchmarks.audit_equality --compare A.json B.json   (two audits' JSON records: equal but
        for timings and the command line, e.g. REQUANT_AUDIT_GROUPS=0 against the default)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _strip(res: dict) -> dict:
    res = {k: v for k, v in res.items() if k not in ("timings", "wall_seconds", "peak_gpu_memory_bytes")}
    if "decode" in res:
        res["decode"] = {k: v for k, v in res["decode"].items() if k != "timings"}
    return res


def first_difference(a, b, path="") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in list(dict.fromkeys([*a, *b])):
            if k not in a or k not in b:
                return f"{path}.{k}: missing on one side"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def compare_files(a: str, b: str) -> int:
    """Two audit JSON records: 0 when equal but for timings and the command line, else 1."""
    ra, rb = (_strip({k: v for k, v in json.load(open(p)).items() if k != "command"}) for p in (a, b))
    diff = first_difference(ra, rb)
    print("equal (but for timings and the command line)" if diff is None else f"DIFFERENT at {diff}")
    return 0 if diff is None else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", nargs="?")
    ap.add_argument("--compare", nargs=2, metavar="JSON", help="compare two audit JSON records instead")
    ap.add_argument("--backends", default="cutlass,triton")
    ap.add_argument("--matrix", default="v2", help="v1..v4, as requant audit --matrix (default v2, as the command)")
    ap.add_argument("--order", default=None, help="the order of a MODULE:FUNCTION member (requant audit --order)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--decode-batches", default="1,8")
    ap.add_argument("--decode-tokens", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.compare:
        return compare_files(*a.compare)
    if a.ckpt is None:
        ap.error("a checkpoint, or --compare A.json B.json")
    from requant.audit.batched import PER_CELL_ENV
    from requant.audit.catalogue.matrix import load_matrix, matrix_path
    from requant.audit.pair import resolve_pair
    from requant.audit.suite import run_audit
    from requant.backends import parse_backends
    from requant.checkpoint import open_checkpoint
    from requant.models.tokenizer import byte_ids_allowed

    ckpt = open_checkpoint(a.ckpt)
    kw = dict(
        phases=("prefill", "decode"),
        decode_batches=tuple(int(b) for b in a.decode_batches.split(",")),
        decode_steps=a.decode_tokens,
        keep_cells="all",
        matrix=load_matrix(matrix_path(a.matrix)),
    )
    resolved = resolve_pair(parse_backends(a.backends), a.order, a.device)  # --order, or conform's fingerprint
    if resolved.failure is not None:
        raise SystemExit(f"audit_equality: {resolved.failure}")
    pair = resolved.kernels
    runs = {}
    with byte_ids_allowed():
        for name, env in (("per-cell", "1"), ("batched", "0")):
            os.environ[PER_CELL_ENV] = env
            t = time.perf_counter()
            runs[name] = run_audit(ckpt, pair, a.prompts, a.device, **kw)
            cells = runs[name]["cells"] + runs[name]["decode"]["cells"]
            print(
                f"{name}: {cells} cells, {time.perf_counter() - t:.1f} s, timings {runs[name]['timings']}", flush=True
            )
    os.environ.pop(PER_CELL_ENV, None)
    diff = first_difference(_strip(runs["per-cell"]), _strip(runs["batched"]))
    rows = len(runs["batched"]["cell_results"]) + len(runs["batched"]["decode"]["cell_results"])
    line = "equal" if diff is None else f"DIFFERENT at {diff}"
    print(f"{line}: {rows} cell rows compared (prefill and decode), per_layer rows, scorecards, histograms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "checkpoint": a.ckpt,
                    "equal": diff is None,
                    "first_difference": diff,
                    "cell_rows": rows,
                    "walls": {k: r["wall_seconds"] for k, r in runs.items()},
                    "options": vars(a),
                },
                f,
                indent=1,
            )
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
