"""W8A8 scaled GEMM in Triton, with the Triton epilogue order.

    acc[m, n] = sum_k a[m, k] * w[n, k]              exact int32 (tl.dot, out_dtype=int32)
    y[m, n]   = bf16_rne( fp32( s_a[m] * fp32(acc) ) * s_w[n] )

Numerics guaranteed, and why:
  * The int32 accumulator is exact: |acc| <= K * 2**14 < 2**31 for K <= MAX_K (checked by
    kernels.reference.check_operands), and integer addition is associative, so the tile
    shape, the K-loop order and the number of stages cannot change it. That is why tile
    configurations may depend on M without changing a bit.
  * fp32(acc) is int32 -> fp32 round to nearest even (sitofp on GPU, numpy astype in the
    interpreter); the two multiplies are separate IEEE fp32 multiplies. There is no add
    to contract them into an FMA, and the kernel is compiled with enable_fp_fusion=False
    anyway, so no future edit of the epilogue can fuse silently.
  * The bf16 rounding is done on the fp32 bits (see _bf16.py), so the kernel gives the
    same bits on a GPU and under TRITON_INTERPRET=1, whose float->bf16 cast truncates.
The result equals kernels.reference.scaled_mm_triton_order bit for bit (the CI oracle).

Shapes: any M, N, K (masks on every edge; M = 1 decode works). M = 0 or N = 0 returns an
empty [M, N] tensor; K = 0 gives acc = 0, hence y = s_a * 0 * s_w = +0 (or -0 for a
negative scale, exactly as the reference computes it).
"""

import torch
import triton
import triton.language as tl

from requant.kernels.reference import check_operands
from requant.kernels.triton._bf16 import bf16_rne_bits

try:  # host-side TMA descriptors (Triton >= 3.4); without them every config uses pointers
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the Triton version
    TensorDescriptor = None

# Explicit tile configurations (no autotuning): (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
# num_warps, num_stages, kind). Chosen from M and N only (config_for); any choice gives the
# same bits (see above), so the choice is about speed alone. kind:
#   "ptr"        pointer loads;
#   "tma"        a and w through tensor descriptors (Hopper's bulk tensor copies; the
#                interpreter emulates them), one program per output tile;
#   "persist"    the same loads, one program per SM looping over tiles (flattened loop);
#   "persist_st" persistent, and the output written through a descriptor too;
#   "persist_ws" persistent with Triton's warp specialization (tuning only: slower here).
# Descriptors need 16-byte aligned rows (K % 16 == 0, a row stride that is a multiple of
# 16 and a 16-byte aligned base); other operands fall back to the pointer kernel with the
# same tile. Out-of-range rows, columns and K are zero-filled by
# the copy engine, which adds nothing to the exact int32 sum.
CONFIGS = {
    "decode": (16, 64, 256, 1, 4, 4, "ptr"),
    "small": (64, 64, 128, 8, 4, 4, "tma"),
    "small_s6": (64, 64, 128, 8, 4, 6, "tma"),
    "mid": (64, 128, 128, 8, 4, 4, "tma"),
    "large": (128, 256, 128, 8, 8, 4, "tma"),
    "large_persist": (128, 256, 128, 16, 8, 4, "persist"),
    # Alternatives the benchmark sweeps (never picked by config_for):
    "medium": (128, 128, 128, 8, 8, 4, "tma"),
    "small_ptr": (64, 64, 128, 8, 4, 4, "ptr"),
    "medium_ptr": (128, 128, 128, 8, 8, 4, "ptr"),
    "large_ptr": (128, 256, 128, 8, 8, 4, "ptr"),
    "large_s3": (128, 256, 128, 8, 8, 3, "tma"),
    "large_m256": (256, 128, 128, 8, 8, 4, "tma"),
    "large_persist_g8": (128, 256, 128, 8, 8, 4, "persist"),
    "large_persist_st": (256, 128, 128, 8, 8, 3, "persist_st"),
}
SMS = 132  # H100/H200 SXM
# 128x256 tiles over 64x128 ones, both in full waves: 1.07-1.15x (kernels_triton_tune.json).
LARGE_TILE_GAIN = 1.1


def _wave_fill(tiles: int) -> float:
    """Fraction of the SM slots busy over the waves that `tiles` programs need."""
    return tiles / (triton.cdiv(tiles, SMS) * SMS)


def config_for(m: int, n: int) -> str:
    """The tile for an [m, n] output. Measured on one H200 (Triton 3.6) with
    benchmarks/tune_triton.py over every Qwen3-1.7B/8B/14B Linear at M = 512, 2048, 8192
    and at 8192^3 (benchmarks/results/kernels_triton_tune.json = round 1, ...tune2.json =
    round 2; TOPS per shape, every pair below from one round):
      * M <= 16 / M <= 128: unchanged from the first benchmark (decode: weight stream;
        64x64 keeps enough programs for N = 1024).
      * 129 <= M <= 1024: 64x128x128, 4 warps, 4 stages (96 KiB smem: two programs fit on
        an SM) once it gives >= 132 tiles, else 64x64x128 with 6 stages. Round 1 at M = 512,
        64x128 vs the old 128x128: Qwen3-8B q,o 1051 vs 865, gate,up 1027 vs 896, down
        1219 vs 1052; 14B gate,up 955 vs 826; 1.7B gate,up 728 vs 723 (old: 64x64).
        Below 132 tiles (1.7B q,o/down, every k,v), round 2, 64x64 with 6 stages vs 4
        stages vs 64x128: 1.7B q,o 547 / 516 / 471, down 838 / 724 / 665, 14B k,v
        428 / 373 / 330.
      * M > 1024: 128x256x128, 8 warps, 4 stages, unless its waves are so partly filled
        that 64x128 wins (fill * LARGE_TILE_GAIN < fill of 64x128): N = 1024 (k,v) at
        M = 2048 gives 64 tiles of 128x256 for 132 SMs, 8B k,v 1069 vs 566 TOPS (round 1);
        14B q,o 1047 vs 988. The persistent variant (one program per SM, GROUP_M 16) for
        N >= 4096 with >= 2 waves of tiles, round 2: 8B gate,up M = 8192 1126 vs 928,
        14B gate,up 1184 vs 1050, 8192^3 1239 vs 1180 (round 1, GROUP_M 8: 1292 vs 1196).
        At N <= 2048 it was mixed (-3% to +4%), so those stay non-persistent.
      Against the best config of each round on each of its 37 points: within 3% on 35
      in round 1 (1.7B q,o M=2048 and 8B down M=2048 lose 3-4%) and on 31 in round 2.
      There persistent tiles led by 4-15% on four N <= 4096 points where this picks the
      non-persistent 128x256 (8B down M=2048: 1262 vs 1100), which in round 1 was level or
      ahead on the same points (1263 vs 1222). The spread between rounds is as large as
      those gaps; the other two lose 3-4% (1.7B k,v M=512, 1.7B q,o M=2048).
    """
    if m <= 16:
        return "decode"
    if m <= 128:
        return "small"
    mid_tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    if m <= 1024:
        return "mid" if mid_tiles >= SMS else "small_s6"
    big = triton.cdiv(m, 128) * triton.cdiv(n, 256)
    if _wave_fill(big) * LARGE_TILE_GAIN < _wave_fill(mid_tiles):
        return "mid"
    if n >= 4096 and big >= 2 * SMS:
        return "large_persist"
    return "large"


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    return _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def _tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped tile order (the tutorial's L2 swizzle): GROUP_M row-blocks share columns.
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_size
    pid_n = (pid % group) // group_size
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, sa_ptr, sw_ptr, out_ptr, M, N, stride_om, offs_m, offs_n):
    # Triton order: t = fp32(s_a * fp32(acc)), then y = bf16_rne(fp32(t * s_w)).
    s_a = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
    s_w = tl.load(sw_ptr + offs_n, mask=offs_n < N, other=0.0)
    t = s_a[:, None] * acc.to(tl.float32)
    y = t * s_w[None, :]
    bits = bf16_rne_bits(y)
    o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, bits, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _scaled_mm_tma_kernel(
    a_desc, w_desc, sa_ptr, sw_ptr, out_ptr,
    M, N, K, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k0 * BLOCK_K])  # [BLOCK_M, BLOCK_K], zero-filled past the edges
        b = w_desc.load([off_n, k0 * BLOCK_K])  # [BLOCK_N, BLOCK_K], K-major as wgmma wants
        acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    _epilogue(acc, sa_ptr, sw_ptr, out_ptr, M, N, stride_om, offs_m, offs_n)


@triton.jit
def _scaled_mm_persistent_kernel(
    a_desc, w_desc, sa_ptr, sw_ptr, out_ptr, out_desc,
    M, N, K, stride_om, num_progs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, TMA_STORE: tl.constexpr,
):
    # One program per SM walks tiles start, start + num_progs, ... (the persistent TMA
    # matmul of Triton's tutorial 09). With flatten=True the K loops of consecutive tiles
    # form one software pipeline, so the next tile's loads are in flight during this
    # tile's epilogue. The per-tile arithmetic is the non-persistent kernel's.
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_c = start - num_progs
    for tile in tl.range(start, num_tiles, num_progs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = w_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        # The epilogue's tile index is recomputed (not carried) so the loop can be flattened.
        tile_c += num_progs
        pid_m, pid_n = _tile_of(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if TMA_STORE:  # the same values, written by the copy engine (clipped at the edges)
            s_a = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
            s_w = tl.load(sw_ptr + offs_n, mask=offs_n < N, other=0.0)
            t = s_a[:, None] * acc.to(tl.float32)
            y = t * s_w[None, :]
            out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], bf16_rne_bits(y))
        else:
            _epilogue(acc, sa_ptr, sw_ptr, out_ptr, M, N, stride_om, offs_m, offs_n)


@triton.jit
def _scaled_mm_kernel(
    a_ptr, w_ptr, sa_ptr, sw_ptr, out_ptr,
    M, N, K,
    stride_am, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows/columns are clamped (wrapped) instead of masked: they load real
    # data that is never stored, which keeps the loads unmasked along M and N.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_left = K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    _epilogue(acc, sa_ptr, sw_ptr, out_ptr, M, N, stride_om, offs_m, offs_n)


def scaled_mm(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, config: str | None = None) -> torch.Tensor:
    """a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1], s_w fp32 [N, 1] -> bf16 [M, N].

    `config` overrides the tile choice (a key of CONFIGS); it never changes bits.
    """
    check_operands(a, w, s_a, s_w)
    m, k = a.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return out
    a = a if a.stride(1) == 1 else a.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    s_a = s_a.contiguous()
    s_w = s_w.contiguous()
    bm, bn, bk, group_m, warps, stages, kind = CONFIGS[config or config_for(m, n)]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (tiles,)
    # Descriptors need a 16-byte aligned base and 16-byte aligned row strides (int8: in
    # elements); K % 16 alone is not enough for a row-strided view such as big[:, :272].
    tma_ok = (
        k % 16 == 0 and k > 0
        and a.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0
        and a.stride(0) % 16 == 0 and w.stride(0) % 16 == 0
    )
    if kind != "ptr" and TensorDescriptor is not None and tma_ok:
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
        if kind.startswith("persist"):
            progs = min(tiles, SMS)
            tma_store = kind == "persist_st" and n % 8 == 0  # 16-byte aligned output rows
            o16 = out.view(torch.int16)
            _scaled_mm_persistent_kernel[(progs,)](
                a_desc, w_desc, s_a, s_w, o16, TensorDescriptor.from_tensor(o16, [bm, bn]) if tma_store else None,
                m, n, k, out.stride(0), progs,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m,
                FLATTEN=(kind != "persist_ws"), WARP_SPECIALIZE=(kind == "persist_ws"), TMA_STORE=tma_store,
                num_warps=warps, num_stages=stages,
                enable_fp_fusion=False,
            )
            return out
        _scaled_mm_tma_kernel[grid](
            a_desc, w_desc,
            s_a, s_w, out.view(torch.int16),
            m, n, k, out.stride(0),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m,
            num_warps=warps, num_stages=stages,
            enable_fp_fusion=False,
        )
        return out
    _scaled_mm_kernel[grid](
        a, w, s_a, s_w, out.view(torch.int16),
        m, n, k,
        a.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, EVEN_K=(k % bk == 0),
        num_warps=warps, num_stages=stages,
        enable_fp_fusion=False,  # every fp32 op rounds on its own (see the module docstring)
    )
    return out
