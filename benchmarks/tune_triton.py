"""Tile sweep for the Triton W8A8 GEMM on the GPU (no CUTLASS build needed).

    python3 -m benchmarks.tune_triton --out DIR [--ms 512,2048,8192] [--rep 25]

Times candidate configurations (kernels.triton.scaled_mm.CONFIGS plus the CANDIDATES
below, injected at run time) on every distinct Qwen3-1.7B/8B/14B Linear shape at the
given M, and at 8192^3, through the production kernel (kernels.triton.scaled_mm with
config=...). Timing: _timing.graph_ms (CUDA graph over >= 256 MiB of rotated operand
copies, CUDA events, median of 5). Before timing, each candidate is checked bit for bit
against kernels.reference.scaled_mm_triton_order on the GPU, on an edge shape and on a full
one; a candidate that fails to compile or to match is dropped.
Writes triton_tune.json (round 1) or triton_tuneR.json (--round R = 2, 3), TOPS per shape and
candidate, into --out and prints a table; benchmarks/results/kernels_triton_tune.json and
kernels_triton_tune2.json are those two files from the H200 runs, renamed (they also hold two
tuning-only kernel kinds, warp-specialized and TMA-store persistent, since removed: their
figures are in docs/log.md).
Points timed by the do_bench fallback (CUDA graph capture failed) are listed under
"do_bench_fallback" and marked with * in the printed table.
Tile choice cannot change bits (exact int32 accumulation); the check pins it anyway.
"""

import argparse
import os
import sys
import time

import torch

from benchmarks._qwen3_shapes import QWEN3  # noqa: E402
from benchmarks._timing import GRAPH, graph_ms  # noqa: E402
from requant.io.output import write_json_atomic  # noqa: E402
from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bitwise_equal  # noqa: E402
from requant.kernels.triton import scaled_mm as tsm  # noqa: E402
from requant.kernels.triton.scaled_mm import CONFIGS  # noqa: E402

ROTATE_BYTES = 256 << 20  # operand sets rotated so that each timed call reads from HBM, not L2


def _copies(m, n, k, elem=1):
    return max(1, min(64, -(-ROTATE_BYTES // ((m * k + n * k) * elem + m * n * 2))))


def operands(m, n, k):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s_a = torch.rand(m, 1, device="cuda") * 0.05 + 1e-4
    s_w = torch.rand(n, 1, device="cuda") * 0.01 + 1e-5
    return a, w, s_a, s_w


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, kind)
CANDIDATES = {
    "t64x128": (64, 128, 128, 8, 4, 4, "tma"),
    "t128x64": (128, 64, 128, 8, 4, 4, "tma"),
    "t64x256": (64, 256, 128, 8, 4, 4, "tma"),
    "t128x128w4s5": (128, 128, 128, 8, 4, 5, "tma"),
    "t128x256k64s6": (128, 256, 64, 8, 8, 6, "tma"),
    "t128x256g16": (128, 256, 128, 16, 8, 4, "tma"),
    "t256x128s3": (256, 128, 128, 8, 8, 3, "tma"),
    "p64x128": (64, 128, 128, 8, 4, 4, "persist"),
    "p128x128": (128, 128, 128, 8, 8, 4, "persist"),
    "p128x128w4s5": (128, 128, 128, 8, 4, 5, "persist"),
    "p128x256": (128, 256, 128, 8, 8, 4, "persist"),
    "p128x256s3": (128, 256, 128, 8, 8, 3, "persist"),
    "p256x128": (256, 128, 128, 8, 8, 4, "persist"),
    "p256x128s3": (256, 128, 128, 8, 8, 3, "persist"),
    # round 2: variants of the round-1 winners (64x128 at M <= 1024, persistent 128x256 above)
    "t64x128s5": (64, 128, 128, 8, 4, 5, "tma"),
    "t64x128k256s3": (64, 128, 256, 8, 4, 3, "tma"),
    "t64x64s6": (64, 64, 128, 8, 4, 6, "tma"),
    "t64x64k256s3": (64, 64, 256, 8, 4, 3, "tma"),
    "p128x256g4": (128, 256, 128, 4, 8, 4, "persist"),
    "p128x256g16": (128, 256, 128, 16, 8, 4, "persist"),
    # configs that kernels.triton.scaled_mm.CONFIGS held during rounds 1-2
    "large_m256": (256, 128, 128, 8, 8, 4, "tma"),
    "large_s3": (128, 256, 128, 8, 8, 3, "tma"),
    "large_ptr": (128, 256, 128, 8, 8, 4, "ptr"),
    "medium_ptr": (128, 128, 128, 8, 8, 4, "ptr"),
    "large_persist_g8": (128, 256, 128, 8, 8, 4, "persist"),
    # round 3 (--round 3): variants of the two-programs-per-SM 128x128 tile
    "t128x128s3g4": (128, 128, 128, 4, 8, 3, "tma"),
    "t128x128s3g16": (128, 128, 128, 16, 8, 3, "tma"),
    "t128x128w4s3": (128, 128, 128, 8, 4, 3, "tma"),
    "t128x128k64s6": (128, 128, 64, 8, 8, 6, "tma"),
    "p128x128s3": (128, 128, 128, 8, 8, 3, "persist"),
}


BASE = ["small", "medium", "large", "large_m256"]
# Round 1 ran BASE and the first 14 CANDIDATES (and the warp-specialized persistent kernel, since
# removed) on every shape at M = 512, 2048, 8192 and 8192^3
# (results/kernels_triton_tune.json); round 2 (--round 2) runs the winners and their variants.
ROUND2_SMALL = ["small", "t64x128", "t64x128s5", "t64x128k256s3", "t64x64s6", "t64x64k256s3"]
ROUND2_LARGE = [
    "large",
    "large_m256",
    "t64x128",
    "p128x256",
    "p128x256g4",
    "p128x256g16",
]
# Round 3: M <= 1024 as round 2; above, the default since then and its variants.
ROUND3_SMALL = ["mid", "small_s6", "medium_s3", "t128x128w4s3"]
ROUND3_LARGE = [
    "medium_s3",
    "medium_ptr_s3",
    "large_persist",
    "mid",
    "t128x128s3g4",
    "t128x128s3g16",
    "t128x128w4s3",
    "t128x128k64s6",
    "p128x128s3",
]


def check(names):
    ok = []
    for name in names:
        try:
            for m, n, k in ((777, 1288, 1552), (512, 4096, 4096)):
                a, w, s_a, s_w = operands(m, n, k)
                got = tsm(a, w, s_a, s_w, config=name)
                torch.cuda.synchronize()
                if not bitwise_equal(got, ref.scaled_mm_triton_order(a, w, s_a, s_w)):
                    raise AssertionError(f"bits differ at {m}x{n}x{k}")
            ok.append(name)
            print("bitwise ok", name, flush=True)
        except Exception as e:  # report and drop
            print("DROPPED", name, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "", flush=True)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--ms", default="512,2048,8192")
    p.add_argument("--rep", type=int, default=25)
    p.add_argument("--round", type=int, default=1, choices=(1, 2, 3))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    CONFIGS.update(CANDIDATES)
    small, large = {2: (ROUND2_SMALL, ROUND2_LARGE), 3: (ROUND3_SMALL, ROUND3_LARGE)}.get(args.round, (None, None))
    if args.round == 1:
        names = check(BASE + list(CANDIDATES)[:14])
    else:
        names = check(list(dict.fromkeys(small + large)))
    print(f"checked in {time.time() - t0:.0f} s", flush=True)
    shapes = [("8192^3", 8192, 8192, 8192)]
    for m in map(int, args.ms.split(",")):
        for model, lins in QWEN3.items():
            for lin, n, k, _ in lins:
                shapes.append((f"{model}|{lin}|{m}", m, n, k))
    res = {
        "command": "python3 -m benchmarks.tune_triton " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "configs": {n: CONFIGS[n] for n in names},
        "tops": {},
        "do_bench_fallback": {},
    }
    path = os.path.join(args.out, f"triton_tune{args.round if args.round > 1 else ''}.json")
    for key, m, n, k in shapes:
        sets = [operands(m, n, k) for _ in range(_copies(m, n, k))]
        row = {}
        for name in names:
            if args.round == 1 and m <= 1024 and CONFIGS[name][0] * CONFIGS[name][1] >= 128 * 256:
                continue  # large tiles at M <= 1024 (fewer tiles than SMs): not worth the time
            if args.round > 1 and name not in (small if m <= 1024 else large):
                continue
            fl = [lambda o=o, c=name: tsm(*o, config=c) for o in sets]
            try:
                ms, method = graph_ms(fl, 100 if m == 8192 and k == 8192 else args.rep)
            except Exception as e:
                print("FAILED", key, name, type(e).__name__, flush=True)
                continue
            row[name] = 2 * m * n * k / ms / 1e9
            if method != GRAPH:
                res["do_bench_fallback"].setdefault(key, []).append(name)
        del sets
        res["tops"][key] = row
        fb = res["do_bench_fallback"].get(key, [])
        if row:
            best = max(row, key=row.get)
            print(
                f"{key:28s} best {best:14s} {row[best]:5.0f} | "
                + " ".join(f"{c}={v:.0f}{'*' if c in fb else ''}" for c, v in row.items()),
                flush=True,
            )
        else:
            print(f"{key:28s} no candidate was timed (all dropped, skipped or failed)", flush=True)
        write_json_atomic(path, res)
    res["elapsed_s"] = time.time() - t0
    write_json_atomic(path, res)
    print(f"done in {res['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
