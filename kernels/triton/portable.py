"""The portable engine's Triton kernels: the arithmetic of kernels/portable.py (its torch
specification) on a GPU, operation for operation.

    exp2_p(x), exp_p(x)        device functions: software exp2 / exp from IEEE fp32 operations
    attention(q, k_cache, v_cache, pos, blocks, scale) -> bf16 [T, H * D]
    silu_mul_quantize(gate_up) -> (q int8 [T, I], s fp32 [T, 1])
    dense(x, w) -> fp32 [M, N] holding bf16(lane_dot(x, w))

What makes the bits portable: no tensor-core MMA and no tl.dot, tl.sum or tl.exp2 whose order or
approximation the hardware picks. Every dot product is an explicit per-lane sequence of fp32 adds of
exact bf16 x bf16 products followed by the adjacent pairwise tree (fused.tree_sum_rows: reductions of
two elements, one IEEE add each); exp2 and exp are a fixed polynomial (kernels/portable.py);
divisions are div_rn. Every kernel is compiled with enable_fp_fusion=False (no FMA contraction: a
product feeding an add rounds on its own, as in torch) and enable_reflect_ftz=False (libdevice's
division keeps subnormals, as the CPU does). A row's operations never depend on the other rows of its
program, so the block sizes are free (they change speed, never bits).
"""

import contextlib

import torch
import triton
import triton.language as tl

from requant.kernels import portable as spec
from requant.kernels.reference import POISON_SCALE_BITS, TINY
from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton.fused import bits_to_fp32, tree_sum_rows
from requant.kernels.triton.quantize import _round_half_even

__all__ = ["attention", "block_m", "dense", "silu_mul_quantize", "tokens_per_block"]

OPTIONS = {"enable_fp_fusion": False}
try:  # libdevice without flush-to-zero (the option exists in recent Triton only)
    from triton.backends.nvidia.compiler import CUDAOptions

    if "enable_reflect_ftz" in CUDAOptions.__dataclass_fields__:
        OPTIONS["enable_reflect_ftz"] = False
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    pass
_LN2 = tl.constexpr(spec.LN2)
_LOG2E = tl.constexpr(spec.LOG2E)
_LN2_HI = tl.constexpr(spec.LN2_HI)
_LN2_LO = tl.constexpr(spec.LN2_LO)
_TINY_ARG = tl.constexpr(spec.TINY_ARG)
_NAN = tl.constexpr(spec.CANONICAL_NAN)
_TINY = tl.constexpr(TINY)
_UP = tl.constexpr(1.0 / TINY)
_POISON = tl.constexpr(POISON_SCALE_BITS)
C9 = tl.constexpr(spec.EXP_POLY[0])
C8 = tl.constexpr(spec.EXP_POLY[1])
C7 = tl.constexpr(spec.EXP_POLY[2])
C6 = tl.constexpr(spec.EXP_POLY[3])
C5 = tl.constexpr(spec.EXP_POLY[4])
C4 = tl.constexpr(spec.EXP_POLY[5])
C3 = tl.constexpr(spec.EXP_POLY[6])
C2 = tl.constexpr(spec.EXP_POLY[7])
C1 = tl.constexpr(spec.EXP_POLY[8])
C0 = tl.constexpr(spec.EXP_POLY[9])


@triton.jit
def _finish(x, k, r):
    p = r * 0.0 + C9
    p = p * r
    p = p + C8
    p = p * r
    p = p + C7
    p = p * r
    p = p + C6
    p = p * r
    p = p + C5
    p = p * r
    p = p + C4
    p = p * r
    p = p + C3
    p = p * r
    p = p + C2
    p = p * r
    p = p + C1
    p = p * r
    p = p + C0
    kc = tl.where(k < -125.0, -125.0, tl.where(k > 127.0, 127.0, k))
    kc = tl.where(k != k, 0.0, kc)
    scale = ((kc.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    y = p * scale
    y = tl.where(k < -125.0, 0.0, y)
    y = tl.where(k > 127.0, float("inf"), y)
    nan = tl.full(x.shape, _NAN, tl.int32).to(tl.float32, bitcast=True)
    return tl.where(x != x, nan, y)


@triton.jit
def exp2_p(x):
    """kernels.portable.exp2, operation for operation."""
    xs = tl.where(tl.abs(x) < _TINY_ARG, 0.0, x)
    k = tl.floor(xs)
    f = xs - k
    r = f * _LN2
    return _finish(x, k, r)


@triton.jit
def exp_p(x):
    """kernels.portable.exp, operation for operation."""
    xs = tl.where(tl.abs(x) < _TINY_ARG, 0.0, x)
    k = tl.floor(xs * _LOG2E)
    r = xs - k * _LN2_HI
    r = r - k * _LN2_LO
    return _finish(x, k, r)


@triton.jit
def _exp2_kernel(x_ptr, o_ptr, n, EXP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if EXP:
        y = exp_p(x)
    else:
        y = exp2_p(x)
    tl.store(o_ptr + offs, y, mask=offs < n)


def elementwise_exp(x: torch.Tensor, base_e: bool = False) -> torch.Tensor:
    """exp2_p (or exp_p) of an fp32 tensor, on its device: the tests' handle on the device functions."""
    x = x.contiguous().reshape(-1)
    out = torch.empty_like(x)
    block = 1024
    _launch.device_index(x)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _exp2_kernel[(-(-x.numel() // block),)](x, out, x.numel(), EXP=base_e, BLOCK=block, **OPTIONS)
    return out


# -- attention ----------------------------------------------------------------------------------
def block_m(heads: int, kv_heads: int) -> int:
    """Rows of an attention program: the query heads of one KV head, padded to a power of two >= 2."""
    g = heads // kv_heads
    return max(2, 1 << max(g - 1, 0).bit_length())


def tokens_per_block(heads: int, kv_heads: int) -> int:
    return block_m(heads, kv_heads) // (heads // kv_heads)


@triton.jit
def _rows(blocks_ptr, pos_ptr, blk, kvh, G: tl.constexpr, BLOCK_M: tl.constexpr):
    tok0 = tl.load(blocks_ptr + blk * 3)
    ntok = tl.load(blocks_ptr + blk * 3 + 1)
    crow = tl.load(blocks_ptr + blk * 3 + 2).to(tl.int64)
    r = tl.arange(0, BLOCK_M)
    ti = r // G
    valid = ti < ntok
    tok = (tok0 + tl.where(valid, ti, 0)).to(tl.int64)
    head = kvh * G + r % G
    pos = tl.where(valid, tl.load(pos_ptr + tok), 0)
    hi = tl.load(pos_ptr + tok0 + ntok - 1) + 1
    return r, valid, tok, head, pos, hi, crow


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    pos_ptr,
    blocks_ptr,
    blk0,
    nsplit,
    cap,
    qk_scale,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    LANES: tl.constexpr,
    SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    j = tl.program_id(2)
    r, valid, tok, head, pos, hi, crow = _rows(blocks_ptr, pos_ptr, blk0 + b, kvh, G, BLOCK_M)
    lo = j * SPLIT
    if lo < hi:
        top = tl.minimum(lo + SPLIT, hi)
        d = tl.arange(0, D)
        lane = tl.arange(0, LANES)
        qrow = (tok * H + head) * D
        base = (crow * KV + kvh) * cap * D
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for n0 in range(lo, top, TILE):
            n = n0 + tl.arange(0, TILE)
            live = n < hi
            nrow = base + n.to(tl.int64) * D
            s3 = tl.zeros((BLOCK_M, TILE, LANES), tl.float32)
            for c in tl.static_range(0, D, LANES):
                lm = c + lane < D  # D below LANES: the lanes past it hold zeros (the spec's padding)
                qc = bits_to_fp32(tl.load(q_ptr + qrow[:, None] + c + lane[None, :], mask=lm[None, :], other=0))
                kc = bits_to_fp32(
                    tl.load(k_ptr + nrow[:, None] + c + lane[None, :], mask=live[:, None] & lm[None, :], other=0)
                )
                s3 = s3 + qc[:, None, :] * kc[None, :, :]
            s = tl.reshape(
                tree_sum_rows(tl.reshape(s3, (BLOCK_M * TILE, LANES)), BLOCK_M * TILE, LANES), (BLOCK_M, TILE)
            )
            s = s * qk_scale
            causal = n[None, :] <= pos[:, None]
            s = tl.where(causal, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.where(m_new == m, 1.0, exp2_p(m - m_new))
            p = tl.where(causal, exp2_p(s - m_new[:, None]), 0.0)
            psum = tl.reshape(tree_sum_rows(p, BLOCK_M, TILE), (BLOCK_M,))
            upd = n0 <= pos
            l_sum = tl.where(upd, l_sum * alpha + psum, l_sum)
            pb = bits_to_fp32(bf16_rne_bits(p))
            v = bits_to_fp32(tl.load(v_ptr + nrow[:, None] + d[None, :], mask=live[:, None], other=0))
            pv3 = tl.where(causal[:, :, None], pb[:, :, None] * v[None, :, :], 0.0)
            pv3 = tl.reshape(tl.permute(pv3, (0, 2, 1)), (BLOCK_M * D, TILE))
            pv = tl.reshape(tree_sum_rows(pv3, BLOCK_M * D, TILE), (BLOCK_M, D))
            acc = tl.where(upd[:, None], acc * alpha[:, None] + pv, acc)
            m = tl.where(upd, m_new, m)
        keep = valid & (pos >= lo)
        slot = ((b * KV + kvh) * nsplit + j) * BLOCK_M + r
        tl.store(m_ptr + slot, m, mask=keep)
        tl.store(l_ptr + slot, l_sum, mask=keep)
        tl.store(acc_ptr + slot.to(tl.int64)[:, None] * D + d[None, :], acc, mask=keep[:, None])


@triton.jit
def _combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    pos_ptr,
    blocks_ptr,
    blk0,
    nsplit,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    r, valid, tok, head, pos, hi, crow = _rows(blocks_ptr, pos_ptr, blk0 + b, kvh, G, BLOCK_M)
    d = tl.arange(0, D)
    slot = (b * KV + kvh) * nsplit * BLOCK_M + r
    m = tl.load(m_ptr + slot, mask=valid, other=0.0)
    l_sum = tl.load(l_ptr + slot, mask=valid, other=1.0)
    acc = tl.load(acc_ptr + slot.to(tl.int64)[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
    for j in range(1, (hi - 1) // SPLIT + 1):
        inc = valid & (pos >= j * SPLIT)
        sj = slot + j * BLOCK_M
        mj = tl.load(m_ptr + sj, mask=inc, other=0.0)
        lj = tl.load(l_ptr + sj, mask=inc, other=0.0)
        aj = tl.load(acc_ptr + sj.to(tl.int64)[:, None] * D + d[None, :], mask=inc[:, None], other=0.0)
        m_new = tl.maximum(m, mj)
        alpha = tl.where(m_new == m, 1.0, exp2_p(m - m_new))
        beta = tl.where(m_new == mj, 1.0, exp2_p(mj - m_new))
        l_sum = tl.where(inc, l_sum * alpha + lj * beta, l_sum)
        acc = tl.where(inc[:, None], acc * alpha[:, None] + aj * beta[:, None], acc)
        m = tl.where(inc, m_new, m)
    out = tl.math.div_rn(acc, l_sum[:, None])
    tl.store(o_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :], bf16_rne_bits(out), mask=valid[:, None])


def _launch_cfg(kernel, name, grid, args, consts, warps, index):
    key = (
        None
        if index is None or _launch.INTERPRET
        else _launch.launch_key(name, "portable", index, args, tuple(consts.values()))
    )
    _launch.launch(kernel, grid, args, consts, dict(OPTIONS, num_warps=warps), key, index)


def attention(q, k_cache, v_cache, pos, blocks, scale: float, split: int | None = None) -> torch.Tensor:
    """kernels.portable.attention on the device. q bf16 [T, H, D]; caches bf16 [rows, KV, cap, D];
    pos int32 [T]; blocks int32 [NB, 3] = (first token, count <= tokens_per_block, cache row)."""
    index = _launch.device_index(q)
    split = spec.SPLIT if split is None else split
    t, heads, d = q.shape
    kv = k_cache.shape[1]
    out = torch.empty((t, heads * d), dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    g = heads // kv
    bm = block_m(heads, kv)
    cap = k_cache.shape[2]
    ns = -(-cap // split)
    nb = blocks.shape[0]
    group = max(1, min(nb, (1 << 29) // (kv * ns * bm * (d + 2) * 4)))
    m_part = torch.empty((group, kv, ns, bm), dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty((group, kv, ns, bm, d), dtype=torch.float32, device=q.device)
    qk_scale = float(torch.tensor(scale * 1.4426950408889634, dtype=torch.float32))
    sc = {"H": heads, "KV": kv, "D": d, "G": g, "BLOCK_M": bm, "TILE": spec.TILE, "LANES": spec.LANES, "SPLIT": split}
    cc = {"H": heads, "KV": kv, "D": d, "G": g, "BLOCK_M": bm, "SPLIT": split}
    qb, kb, vb = q.view(torch.int16), k_cache.view(torch.int16), v_cache.view(torch.int16)
    for b0 in range(0, nb, group):
        n = min(group, nb - b0)
        args = (qb, kb, vb, m_part, l_part, acc_part, pos, blocks, b0, ns, cap, qk_scale)
        _launch_cfg(_split_kernel, "p_attention_split", (n, kv, ns), args, sc, 4, index)
        args = (m_part, l_part, acc_part, out.view(torch.int16), pos, blocks, b0, ns)
        _launch_cfg(_combine_kernel, "p_attention_combine", (n, kv, 1), args, cc, 4, index)
    return out


# -- SiLU and the lm_head ------------------------------------------------------------------------
@triton.jit
def _silu_mul_quantize_kernel(gu_ptr, act_ptr, q_ptr, s_ptr, n, BLOCK_K: tl.constexpr):
    # fused._silu_mul_quantize_kernel with exp_p in place of the device's exp
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mag = tl.zeros((BLOCK_K,), tl.int32)
    for k0 in range(0, n, BLOCK_K):
        mask = k0 + offs < n
        g = bits_to_fp32(tl.load(gu_ptr + t * 2 * n + k0 + offs, mask=mask, other=0))
        u = bits_to_fp32(tl.load(gu_ptr + t * 2 * n + n + k0 + offs, mask=mask, other=0))
        bits = bf16_rne_bits(tl.math.div_rn(g, exp_p(-g) + 1.0) * u)
        tl.store(act_ptr + t * n + k0 + offs, bits, mask=mask)
        mm = bits_to_fp32(bits).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        mag = tl.maximum(mag, tl.where(mask, mm, 0))
    mag = tl.max(mag, axis=0)
    bad = mag >= 0x7F800000
    amax = mag.to(tl.float32, bitcast=True)
    zero = amax == 0.0
    up = tl.where(amax < _TINY, _UP, 1.0)
    safe = tl.where(zero, 1.0, amax)
    s = tl.where(zero, 0.0, tl.math.div_rn(safe, 127.0 + tl.zeros_like(safe)))
    inv = tl.where(zero, 0.0, tl.math.div_rn(127.0 + tl.zeros_like(safe), safe * up))
    poison = tl.full((), _POISON, tl.int32).to(tl.float32, bitcast=True)
    tl.store(s_ptr + t, tl.where(bad, poison, s))
    tl.debug_barrier()
    for k0 in range(0, n, BLOCK_K):
        mask = k0 + offs < n
        a = bits_to_fp32(tl.load(act_ptr + t * n + k0 + offs, mask=mask, other=0))
        v = _round_half_even((a * up) * inv)
        v = tl.minimum(tl.maximum(v, -128.0), 127.0)
        v = tl.where(bad, 0.0, v)
        tl.store(q_ptr + t * n + k0 + offs, v.to(tl.int8), mask=mask)


def silu_mul_quantize(gate_up: torch.Tensor):
    """gate_up bf16 [T, 2 I] -> quantize_activations(kernels.portable.silu_mul(gate_up))."""
    index = _launch.device_index(gate_up)
    t, n2 = gate_up.shape
    n = n2 // 2
    q = torch.empty((t, n), dtype=torch.int8, device=gate_up.device)
    s = torch.empty((t, 1), dtype=torch.float32, device=gate_up.device)
    if t == 0:
        return q, s
    act = torch.empty((t, n), dtype=torch.int16, device=gate_up.device)
    args = (gate_up.contiguous().view(torch.int16), act, q, s, n)
    _launch_cfg(_silu_mul_quantize_kernel, "p_silu", (t, 1, 1), args, {"BLOCK_K": 2048}, 4, index)
    return q, s


@triton.jit(do_not_specialize=["M"])
def _dense_kernel(x_ptr, w_ptr, o_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, LANES: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    offs_n = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    lane = tl.arange(0, LANES)
    acc = tl.zeros((BM, BN, LANES), tl.float32)
    for k0 in range(0, K, LANES):
        km = k0 + lane < K
        a = bits_to_fp32(
            tl.load(x_ptr + offs_m[:, None] * K + k0 + lane[None, :], mask=(offs_m[:, None] < M) & km[None, :], other=0)
        )
        b = bits_to_fp32(
            tl.load(w_ptr + offs_n[:, None] * K + k0 + lane[None, :], mask=(offs_n[:, None] < N) & km[None, :], other=0)
        )
        acc = acc + a[:, None, :] * b[None, :, :]
    y = tl.reshape(tree_sum_rows(tl.reshape(acc, (BM * BN, LANES)), BM * BN, LANES), (BM, BN))
    y = bits_to_fp32(bf16_rne_bits(y))
    tl.store(o_ptr + offs_m[:, None] * N + offs_n[None, :], y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def dense(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.portable.dense on the device: x bf16 [M, K], w bf16 [N, K] -> fp32 [M, N]."""
    index = _launch.device_index(x)
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m == 0 or n == 0:
        return out
    bm = min(8, 1 << max(m - 1, 0).bit_length())
    bn = 256 // bm
    args = (x.contiguous().view(torch.int16), w.contiguous().view(torch.int16), out, m, n, k)
    consts = {"BM": bm, "BN": bn, "LANES": spec.LANES}
    _launch_cfg(_dense_kernel, "p_dense", (-(-m // bm), -(-n // bn), 1), args, consts, 4, index)
    return out
