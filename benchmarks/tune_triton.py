"""Tile sweep for the Triton W8A8 GEMM on the GPU (no CUTLASS build needed).

    python3 benchmarks/tune_triton.py --out DIR [--ms 512,2048,8192] [--rep 25]

Times candidate configurations (kernels.triton.scaled_mm.CONFIGS plus the CANDIDATES
below, injected at run time) on every distinct Qwen3-1.7B/8B/14B Linear shape at the
given M, and at 8192^3. Two candidate kinds exist only here (tuning-only, never faster in
the rounds so far, kept out of the production kernel since issue 10): "persist_ws"
(persistent with Triton's warp specialization) and "persist_st" (persistent, output written
through a TMA descriptor); _tune_persistent_kernel below implements both. Timing as in
bench_kernels.py (CUDA graph over >= 256 MiB
of rotated operand copies, CUDA events, median of 5). Before timing, each candidate is
checked bit for bit against kernels.reference.scaled_mm_triton_order on the GPU, on an
edge shape and on a full one; a candidate that fails to compile or to match is dropped.
Writes triton_tune.json (round 1) or triton_tuneR.json (--round R = 2, 3), TOPS per shape and
candidate, into --out and prints a table; benchmarks/results/kernels_triton_tune.json and
kernels_triton_tune2.json are those two files from the H200 runs, renamed.
Points timed by bench_kernels' do_bench fallback (CUDA graph capture failed) are listed
under "do_bench_fallback" and marked with * in the printed table.
Tile choice cannot change bits (exact int32 accumulation); the check pins it anyway.
"""

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_kernels import GRAPH, QWEN3, _copies, _time, operands  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bitwise_equal  # noqa: E402
from requant.kernels.reference import check_operands  # noqa: E402
from requant.kernels.triton import scaled_mm as _production  # noqa: E402
from requant.kernels.triton._bf16 import bf16_rne_bits  # noqa: E402
from requant.kernels.triton.scaled_mm import CONFIGS, SMS, _epilogue, _tile_of  # noqa: E402

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
    "pws128x256": (128, 256, 128, 8, 8, 4, "persist_ws"),
    # round 2: variants of the round-1 winners (64x128 at M <= 1024, persistent 128x256 above)
    "t64x128s5": (64, 128, 128, 8, 4, 5, "tma"),
    "t64x128k256s3": (64, 128, 256, 8, 4, 3, "tma"),
    "t64x64s6": (64, 64, 128, 8, 4, 6, "tma"),
    "t64x64k256s3": (64, 64, 256, 8, 4, 3, "tma"),
    "p128x256g4": (128, 256, 128, 4, 8, 4, "persist"),
    "p128x256g16": (128, 256, 128, 16, 8, 4, "persist"),
    "pst128x256": (128, 256, 128, 8, 8, 4, "persist_st"),
    "pst128x256g16": (128, 256, 128, 16, 8, 4, "persist_st"),
    "pst256x128s3": (256, 128, 128, 8, 8, 3, "persist_st"),
    # configs that were in kernels.triton.scaled_mm.CONFIGS before issue 10 (rounds 1-2 used them)
    "large_m256": (256, 128, 128, 8, 8, 4, "tma"),
    "large_s3": (128, 256, 128, 8, 8, 3, "tma"),
    "large_ptr": (128, 256, 128, 8, 8, 4, "ptr"),
    "medium_ptr": (128, 128, 128, 8, 8, 4, "ptr"),
    "large_persist_g8": (128, 256, 128, 8, 8, 4, "persist"),
    "large_persist_st": (256, 128, 128, 8, 8, 3, "persist_st"),
    # round 3 (--round 3, issue 10): variants of the two-programs-per-SM 128x128 tile
    "t128x128s3g4": (128, 128, 128, 4, 8, 3, "tma"),
    "t128x128s3g16": (128, 128, 128, 16, 8, 3, "tma"),
    "t128x128w4s3": (128, 128, 128, 8, 4, 3, "tma"),
    "t128x128k64s6": (128, 128, 64, 8, 8, 6, "tma"),
    "p128x128s3": (128, 128, 128, 8, 8, 3, "persist"),
}


@triton.jit
def _tune_persistent_kernel(
    a_desc,
    w_desc,
    sa_ptr,
    sw_ptr,
    out_ptr,
    out_desc,
    M,
    N,
    K,
    stride_om,
    num_progs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    TMA_STORE: tl.constexpr,
):
    # The production persistent kernel (kernels/triton/scaled_mm.py) with two tuning options.
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_c = start - num_progs
    for tile in tl.range(start, num_tiles, num_progs, flatten=not WARP_SPECIALIZE, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        tile_c += num_progs
        pid_m, pid_n = _tile_of(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if TMA_STORE:  # the same values, written by the copy engine (clipped at the edges)
            s_a = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
            s_w = tl.load(sw_ptr + offs_n, mask=offs_n < N, other=0.0)
            y = (s_a[:, None] * acc.to(tl.float32)) * s_w[None, :]
            out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], bf16_rne_bits(y).to(tl.bfloat16, bitcast=True))
        else:
            _epilogue(acc, sa_ptr, sw_ptr, out_ptr, M, N, stride_om, offs_m, offs_n)


def tsm(a, w, s_a, s_w, config):
    """kernels.triton.scaled_mm with `config`, or the tuning-only kinds implemented here."""
    bm, bn, bk, group_m, warps, stages, kind = CONFIGS[config]
    if kind not in ("persist_ws", "persist_st"):
        return _production(a, w, s_a, s_w, config=config)
    check_operands(a, w, s_a, s_w)
    m, k = a.shape
    n = w.shape[0]
    assert k % 16 == 0 and n % 8 == 0 and a.is_contiguous() and w.is_contiguous(), "tuning shapes are TMA-aligned"
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    progs = min(triton.cdiv(m, bm) * triton.cdiv(n, bn), SMS)
    tma_store = kind == "persist_st"
    _tune_persistent_kernel[(progs,)](
        TensorDescriptor.from_tensor(a, [bm, bk]),
        TensorDescriptor.from_tensor(w, [bn, bk]),
        s_a.contiguous(),
        s_w.contiguous(),
        out,
        TensorDescriptor.from_tensor(out, [bm, bn]) if tma_store else None,
        m,
        n,
        k,
        out.stride(0),
        progs,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group_m,
        WARP_SPECIALIZE=kind == "persist_ws",
        TMA_STORE=tma_store,
        num_warps=warps,
        num_stages=stages,
        enable_fp_fusion=False,
    )
    return out


BASE = ["small", "medium", "large", "large_m256"]
# Round 1 ran BASE and the first 15 CANDIDATES on every shape at M = 512, 2048, 8192 and 8192^3
# (results/kernels_triton_tune.json); round 2 (--round 2) runs the winners and their variants.
ROUND2_SMALL = ["small", "t64x128", "t64x128s5", "t64x128k256s3", "t64x64s6", "t64x64k256s3"]
ROUND2_LARGE = [
    "large",
    "large_m256",
    "t64x128",
    "p128x256",
    "p128x256g4",
    "p128x256g16",
    "pst128x256",
    "pst128x256g16",
    "pst256x128s3",
]
# Round 3 (issue 10): M <= 1024 as round 2; above, the new default and its variants.
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
    "pws128x256",
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
        names = check(BASE + list(CANDIDATES)[:15])
    else:
        names = check(list(dict.fromkeys(small + large)))
    print(f"checked in {time.time() - t0:.0f} s", flush=True)
    shapes = [("8192^3", 8192, 8192, 8192)]
    for m in map(int, args.ms.split(",")):
        for model, lins in QWEN3.items():
            for lin, n, k, _ in lins:
                shapes.append((f"{model}|{lin}|{m}", m, n, k))
    res = {
        "command": "python3 benchmarks/tune_triton.py " + " ".join(sys.argv[1:]),
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
                ms, method = _time(fl, 100 if m == 8192 and k == 8192 else args.rep)
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
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    res["elapsed_s"] = time.time() - t0
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"done in {res['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
