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

import functools

import torch
import triton
import triton.language as tl

from requant.kernels.reference import check_operands
from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton._launch import TensorDescriptor

# Explicit tile configurations (no autotuning): (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
# num_warps, num_stages, kind). Chosen from M and N only (config_for); any choice gives the
# same bits (see above), so the choice is about speed alone. kind:
#   "ptr"     pointer loads;
#   "tma"     a and w through tensor descriptors (Hopper's bulk tensor copies; the
#             interpreter emulates them), one program per output tile;
#   "persist" the same loads, one program per SM looping over tiles (flattened loop).
# Descriptors need 16-byte aligned rows (K % 16 == 0, a row stride that is a multiple of
# 16 and a 16-byte aligned base); other operands fall back to the pointer kernel with the
# same tile. Out-of-range rows, columns and K are zero-filled by the copy engine, which adds
# nothing to the exact int32 sum. Shared memory per program is stages x (BLOCK_M + BLOCK_N)
# x BLOCK_K bytes: 96 KiB for mid (4 stages) and medium_s3 (3 stages), so two programs fit
# on an SM (228 KiB) and one's epilogue overlaps the other's loads.
# Tuning-only variants (warp specialization, a TMA-store epilogue, more tile shapes) live in
# benchmarks/tune_triton.py.
CONFIGS = {
    "decode": (16, 64, 256, 1, 4, 4, "ptr"),
    "small": (64, 64, 128, 8, 4, 4, "tma"),
    "small_s6": (64, 64, 128, 8, 4, 6, "tma"),
    "mid": (64, 128, 128, 8, 4, 4, "tma"),
    "medium_s3": (128, 128, 128, 8, 8, 3, "tma"),
    # Alternatives the benchmarks time (never picked by config_for):
    "medium_ptr_s3": (128, 128, 128, 8, 8, 3, "ptr"),  # issue 10's plain kernel, our epilogue
    "medium": (128, 128, 128, 8, 8, 4, "tma"),  # 4 stages: 128 KiB, one program per SM
    "large": (128, 256, 128, 8, 8, 4, "tma"),  # the M > 1024 choice before issue 10 ...
    "large_persist": (128, 256, 128, 16, 8, 4, "persist"),  # ... and for N >= 4096
    "small_ptr": (64, 64, 128, 8, 4, 4, "ptr"),
}
SMS = 132  # H100/H200 SXM
# Programs of mid / medium_s3 that run at once: two per SM (96 KiB of shared memory each).
SLOTS = 2 * SMS
# 128x128 tiles over 64x128 ones, both in full waves. Assumed from the measured 1.07-1.15x of
# 128x256 over 64x128 (kernels_triton_tune.json); bench_speed.py's sweep measures it.
MEDIUM_TILE_GAIN = 1.1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # plain ints: triton.cdiv is a constexpr_function in Triton 3.9 (~10 us)


def _wave_fill(tiles: int, slots: int = SMS) -> float:
    """Fraction of the program slots busy over the waves that `tiles` programs need."""
    return tiles / (_cdiv(tiles, slots) * slots)


@functools.lru_cache(maxsize=4096)
def config_for(m: int, n: int) -> str:
    """The tile for an [m, n] output. Measured on one H200 (Triton 3.6) with
    benchmarks/tune_triton.py over every Qwen3-1.7B/8B/14B Linear at M = 512, 2048, 8192
    and at 8192^3 (benchmarks/results/kernels_triton_tune.json = round 1, ...tune2.json =
    round 2; TOPS per shape, every pair below from one round), and in issue 10:
      * M <= 16 / M <= 128: unchanged from the first benchmark (decode: weight stream;
        64x64 keeps enough programs for N = 1024).
      * 129 <= M <= 1024: 64x128x128, 4 warps, 4 stages (96 KiB smem: two programs fit on
        an SM) once it gives >= 132 tiles, else 64x64x128 with 6 stages. Round 1 at M = 512,
        64x128 vs the old 128x128: Qwen3-8B q,o 1051 vs 865, gate,up 1027 vs 896, down
        1219 vs 1052; 14B gate,up 955 vs 826; 1.7B gate,up 728 vs 723 (old: 64x64).
        Below 132 tiles (1.7B q,o/down, every k,v), round 2, 64x64 with 6 stages vs 4
        stages vs 64x128: 1.7B q,o 547 / 516 / 471, down 838 / 724 / 665, 14B k,v
        428 / 373 / 330. Issue 10 (same process, do_bench): at 512 x 4096 x 12288 this
        gave 925 TOPS against 900 for the plain 128x128x128 / 8 warps / 3 stages tile.
      * M > 1024: 128x128x128, 8 warps, 3 stages ("medium_s3"; 96 KiB, two programs per
        SM), non-persistent. Issue 10 measured that plain tile ahead of the former choice
        (128x256, persistent for N >= 4096) by 12-15%: 8192^3 1237 vs 1117 TOPS,
        2048 x 4096 x 12288 1262 vs 1095, 2048 x 5120 x 17408 1236 vs 1078, 4096 x 12288 x
        4096 1299 vs 1121. The 4-stage 128x128 (128 KiB, one program per SM) was behind in
        the tuning rounds (8B gate,up M = 2048: 930 vs 1100 persistent 128x256), so the
        third stage's smem is what the second resident program needs.
        Wave quantization stays: with SLOTS = 264 programs in flight, the 64x128 tile is
        taken instead when the 128x128 grid fills its last wave so poorly that
        fill(128x128) * MEDIUM_TILE_GAIN < fill(64x128): N = 1024 (k,v) at M = 2048 gives
        128 tiles of 128x128 for 264 slots (fill 0.48; 64x128: 256 tiles, 0.97). Round 1
        measured the same effect with 128x256 tiles: 8B k,v M = 2048 1069 (64x128) vs 566.
    """
    if m <= 16:
        return "decode"
    if m <= 128:
        return "small"
    mid_tiles = _cdiv(m, 64) * _cdiv(n, 128)
    if m <= 1024:
        return "mid" if mid_tiles >= SMS else "small_s6"
    medium_tiles = _cdiv(m, 128) * _cdiv(n, 128)
    if _wave_fill(medium_tiles, SLOTS) * MEDIUM_TILE_GAIN < _wave_fill(mid_tiles, SLOTS):
        return "mid"
    return "medium_s3"


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
    bits = bf16_rne_bits(y)  # int16 holding the bf16 bits; stored as they are (a bitcast)
    o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, bits.to(tl.bfloat16, bitcast=True), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


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
    a_desc, w_desc, sa_ptr, sw_ptr, out_ptr,
    M, N, K, stride_om, num_progs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # One program per SM walks tiles start, start + num_progs, ... (the persistent TMA
    # matmul of Triton's tutorial 09). With flatten=True the K loops of consecutive tiles
    # form one software pipeline, so the next tile's loads are in flight during this
    # tile's epilogue. The per-tile arithmetic is the non-persistent kernel's.
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_c = start - num_progs
    for tile in tl.range(start, num_tiles, num_progs, flatten=True):
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


_A_DESC = "a_desc"  # launch-key markers of the two descriptor arguments (see _launch.launch_key)
_W_DESC = "w_desc"
_FIXED: dict = {}  # (config name, CONFIGS entry) -> what its launches share (_fixed)


def _fixed(name: str):
    """Per config: the tile, the compile options and the constexprs (built once, not per call)."""
    cfg = CONFIGS[name]
    f = _FIXED.get((name, cfg))
    if f is None:
        bm, bn, bk, group_m, warps, stages, kind = cfg
        # enable_fp_fusion=False: every fp32 op rounds on its own (see the module docstring)
        options = {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": False}
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m}
        f = _FIXED[(name, cfg)] = (bm, bn, bk, kind, options, consts, tuple(consts.values()))
    return f


def scaled_mm(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, config: str | None = None,
              cached: bool = True) -> torch.Tensor:
    """a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1], s_w fp32 [N, 1] -> bf16 [M, N].

    `config` overrides the tile choice (a key of CONFIGS); it never changes bits.
    `cached=False` launches through Triton's JITFunction on every call (the host path before
    issue 10, kept for the benchmark's before/after); see _launch.py. Same bits either way.
    """
    index = _launch.device_index(a)  # refuses tensors the backend cannot run on
    check_operands(a, w, s_a, s_w)
    m, k = a.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return out
    a_rs, a_cs = a.stride()
    w_rs, w_cs = w.stride()
    if a_cs != 1:
        a = a.contiguous()
        a_rs = a.stride(0)
    if w_cs != 1:
        w = w.contiguous()
        w_rs = w.stride(0)
    s_a = s_a.contiguous()
    s_w = s_w.contiguous()
    name = config or config_for(m, n)
    bm, bn, bk, kind, options, consts, const_vals = _fixed(name)
    fast = cached and index is not None and not _launch.INTERPRET
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    a_ptr = a.data_ptr()
    w_ptr = w.data_ptr()
    # Descriptors need a 16-byte aligned base and 16-byte aligned row strides (int8: in
    # elements); K % 16 alone is not enough for a row-strided view such as big[:, :272].
    if (kind != "ptr" and TensorDescriptor is not None and k > 0
            and not (k & 15 or a_ptr & 15 or w_ptr & 15 or a_rs & 15 or w_rs & 15)):
        if kind == "persist":
            progs = min(tiles, SMS)
            kernel, grid, tail = _scaled_mm_persistent_kernel, (progs, 1, 1), (s_a, s_w, out, m, n, k, n, progs)
        else:
            kernel, grid, tail = _scaled_mm_tma_kernel, (tiles, 1, 1), (s_a, s_w, out, m, n, k, n)
        key = ck = None
        if fast:  # the descriptors enter the key as markers: int8 base, block shape fixed by `name`
            key = _launch.launch_key(kind, name, index, (_A_DESC, _W_DESC) + tail, const_vals)
            ck = _launch.compiled(key)
        if ck is not None:  # descriptors cached by value (_launch.descriptor_of)
            descs = (_launch.descriptor_of(a_ptr, m, k, a_rs, bm, bk), _launch.descriptor_of(w_ptr, n, k, w_rs, bn, bk))
        else:
            descs = (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]))
        _launch.launch(kernel, grid, descs + tail, consts, options, key, index, ck)
        return out
    consts = dict(consts, EVEN_K=k % bk == 0)
    args = (a, w, s_a, s_w, out, m, n, k, a_rs, w_rs, n)
    key = _launch.launch_key(kind, name, index, args, const_vals + (k % bk == 0,)) if fast else None
    _launch.launch(_scaled_mm_kernel, (tiles, 1, 1), args, consts, options, key, index)
    return out
