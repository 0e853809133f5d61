"""Fused row kernels of the runtime's fast path (requant/runtime/fast.py), in Triton.

    add_rms_norm(x, w, eps, delta=None, quantize=True, write_h=False, rows=None)
        -> (h bf16 | None, q int8 | None, s fp32 | None); x updated in place to bf16(x + delta)
    qk_norm_rope(qkv, q_w, k_w, cos, sin, pos, rows, k_cache, v_cache, heads, kv_heads, eps) -> q bf16 [T, H, D]
    silu_mul_quantize(gate_up) -> (q int8 [T, I], s fp32 [T, 1])

Every kernel runs one program per token row (qk_norm_rope: all heads of one token) with a block
that covers the whole row (silu_mul_quantize: fixed slices of SILU_BLOCK_K): its size is a
function of the row length alone (the next power of two), never of the number of rows. So a row's arithmetic is the same code on the same
data whatever else is in the call: BATCH INVARIANCE by construction, no measurement needed.

Proof of each kernel's numerics: docs/kernels.md#the-fused-row-kernels-kernelstritonfusedpy.
"""

import torch
import triton
import triton.language as tl

from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton._portable_math import OPTIONS as PORTABLE_OPTIONS
from requant.kernels.triton._portable_math import exp_p
from requant.kernels.triton.quantize import _POISON, _round_half_even, activation_scales

__all__ = ["add_rms_norm", "qk_norm_rope", "row_block", "silu_mul_quantize"]

OPTIONS = {"enable_fp_fusion": False}
SILU_BLOCK_K = 2048  # the SiLU kernel's slice of a row (fixed: never depends on the number of rows)


def row_block(n: int) -> int:
    """The block of a row of n elements: the next power of two (a function of n alone)."""
    return 1 << max(n - 1, 0).bit_length()


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@triton.jit
def bits_to_fp32(b):
    """int16 bf16 bits -> the same value in fp32 (exact)."""
    return (b.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _pair(x, R: tl.constexpr, N: tl.constexpr):
    # [R, N] -> [R, N // 2]: y[:, j] = x[:, 2 j] + x[:, 2 j + 1] (one add per element)
    return tl.sum(tl.reshape(x, (R, N // 2, 2)), axis=2)


@triton.jit
def tree_sum_rows(x, R: tl.constexpr, N: tl.constexpr):
    """[R, N] fp32 (N a power of two <= 32768) -> [R, 1]: the adjacent pairwise tree of
    requant.kernels.emulation.tree_sum_adjacent per row."""
    if N >= 32768:
        x = _pair(x, R, 32768)
    if N >= 16384:
        x = _pair(x, R, 16384)
    if N >= 8192:
        x = _pair(x, R, 8192)
    if N >= 4096:
        x = _pair(x, R, 4096)
    if N >= 2048:
        x = _pair(x, R, 2048)
    if N >= 1024:
        x = _pair(x, R, 1024)
    if N >= 512:
        x = _pair(x, R, 512)
    if N >= 256:
        x = _pair(x, R, 256)
    if N >= 128:
        x = _pair(x, R, 128)
    if N >= 64:
        x = _pair(x, R, 64)
    if N >= 32:
        x = _pair(x, R, 32)
    if N >= 16:
        x = _pair(x, R, 16)
    if N >= 8:
        x = _pair(x, R, 8)
    if N >= 4:
        x = _pair(x, R, 4)
    if N >= 2:
        x = _pair(x, R, 2)
    return x


@triton.jit
def _rms_scale(x, n, eps, R: tl.constexpr, N: tl.constexpr):
    # 1 / sqrt(tree(x * x) / n + eps), IEEE square root and divisions; [R, 1]
    ss = tree_sum_rows(x * x, R, N)
    var = tl.math.div_rn(ss, n + tl.zeros_like(ss))
    return tl.math.div_rn(1.0 + tl.zeros_like(ss), tl.math.sqrt_rn(var + eps))


@triton.jit
def _quantize_store(h, mask, q_ptrs, s_ptr):
    # kernels.reference.quantize_activations of one row h [1, B] (bf16 values in fp32, 0 where
    # masked): stores q through q_ptrs and s at s_ptr.
    # One integer max over the magnitude bits gives both the absmax (the order of non-negative
    # floats is the order of their bits) and the NaN/inf test (exponent all ones: >= inf's bits).
    mag = tl.max(h.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    bad = mag >= 0x7F800000
    amax = mag.to(tl.float32, bitcast=True)
    s, up, inv = activation_scales(amax)
    poison = tl.full((1,), _POISON, tl.int32).to(tl.float32, bitcast=True)
    tl.store(s_ptr + tl.arange(0, 1), tl.where(bad, poison, s))
    v = _round_half_even((h * up[:, None]) * inv[:, None])
    v = tl.minimum(tl.maximum(v, -128.0), 127.0)
    v = tl.where(bad[:, None], 0.0, v)
    tl.store(q_ptrs, v.to(tl.int8), mask=mask)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    d_ptr,
    w_ptr,
    h_ptr,
    q_ptr,
    s_ptr,
    rows_ptr,
    n,
    eps,
    BLOCK: tl.constexpr,
    HAS_D: tl.constexpr,
    WRITE_H: tl.constexpr,
    QUANT: tl.constexpr,
    ROW_MAP: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if ROW_MAP:
        row = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        row = pid
    offs = tl.arange(0, BLOCK)[None, :]
    mask = offs < n
    x = bits_to_fp32(tl.load(x_ptr + row * n + offs, mask=mask, other=0))
    if HAS_D:  # the residual add, bf16 + bf16 rounded once, written back into x
        d = bits_to_fp32(tl.load(d_ptr + row * n + offs, mask=mask, other=0))
        xb = bf16_rne_bits(x + d)
        tl.store(x_ptr + row * n + offs, xb, mask=mask)
        x = bits_to_fp32(xb)
    r = _rms_scale(x, n.to(tl.float32), eps, 1, BLOCK)
    xn = bits_to_fp32(bf16_rne_bits(x * r))
    w = bits_to_fp32(tl.load(w_ptr + offs, mask=mask, other=0))
    hb = bf16_rne_bits(w * xn)
    if WRITE_H:
        tl.store(h_ptr + pid * n + offs, hb, mask=mask)
    if QUANT:
        _quantize_store(bits_to_fp32(hb), mask, q_ptr + pid * n + offs, s_ptr + pid)


@triton.jit
def _norm_rope_rows(
    src,
    w_ptr,
    c,
    s,
    r_idx,
    offs,
    partner,
    sign,
    mask,
    eps,
    R: tl.constexpr,
    D: tl.constexpr,
):
    # RoPE(RMSNorm(x)) of the R x D heads at src (rows masked by `mask`), as int16 bf16 bits
    x = bits_to_fp32(tl.load(src + r_idx * D + offs, mask=mask, other=0))
    xp = bits_to_fp32(tl.load(src + r_idx * D + partner, mask=mask, other=0))
    w = bits_to_fp32(tl.load(w_ptr + offs))
    wp = bits_to_fp32(tl.load(w_ptr + partner))
    r = _rms_scale(x, D * 1.0, eps, R, D)
    y = bits_to_fp32(bf16_rne_bits(w * bits_to_fp32(bf16_rne_bits(x * r))))
    yp = bits_to_fp32(bf16_rne_bits(wp * bits_to_fp32(bf16_rne_bits(xp * r))))
    return bf16_rne_bits(y * c + (yp * sign) * s)


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    rows_ptr,
    kc_ptr,
    vc_ptr,
    q_ptr,
    cap,
    eps,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HP: tl.constexpr,
    KVP: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, D)[None, :]
    half = D // 2
    partner = (offs + half) % D  # rotate_half: -y[i + D/2] for i < D/2, y[i - D/2] after
    sign = tl.where(offs < half, -1.0, 1.0)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + pos * D + offs)
    s = tl.load(sin_ptr + pos * D + offs)
    src = qkv_ptr + t * ((H + 2 * KV) * D)
    hq = tl.arange(0, HP)[:, None]
    mq = hq < H
    out_q = _norm_rope_rows(src, qw_ptr, c, s, hq, offs, partner, sign, mq, eps, HP, D)
    tl.store(q_ptr + (t * H + hq) * D + offs, out_q, mask=mq)
    hk = tl.arange(0, KVP)[:, None]
    mk = hk < KV
    out_k = _norm_rope_rows(src + H * D, kw_ptr, c, s, hk, offs, partner, sign, mk, eps, KVP, D)
    row = tl.load(rows_ptr + t).to(tl.int64)
    slot = ((row * KV + hk) * cap + pos) * D + offs
    tl.store(kc_ptr + slot, out_k, mask=mk)
    tl.store(
        vc_ptr + slot,
        tl.load(src + (H + KV) * D + hk * D + offs, mask=mk, other=0),
        mask=mk,
    )


@triton.jit
def _silu_mul_quantize_kernel(gu_ptr, act_ptr, q_ptr, s_ptr, n, BLOCK_K: tl.constexpr, PORTABLE: tl.constexpr):
    # Two passes over the row in BLOCK_K slices (few registers, many programs per SM): the first
    # writes act = bf16(SiLU(g) * u) to `act` and keeps the largest magnitude bits (an exact
    # max, in any order), the second quantizes act as read back (each thread reads what it wrote).
    # PORTABLE (kernels/triton/portable.py): the software exp_p for the device's exp, resolved at
    # compile time.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mag = tl.zeros((BLOCK_K,), tl.int32)
    for k0 in range(0, n, BLOCK_K):
        mask = k0 + offs < n
        g = bits_to_fp32(tl.load(gu_ptr + t * 2 * n + k0 + offs, mask=mask, other=0))
        u = bits_to_fp32(tl.load(gu_ptr + t * 2 * n + n + k0 + offs, mask=mask, other=0))
        if PORTABLE:
            bits = bf16_rne_bits(tl.math.div_rn(g, exp_p(-g) + 1.0) * u)
        else:
            bits = bf16_rne_bits(tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u)
        tl.store(act_ptr + t * n + k0 + offs, bits, mask=mask)
        m = bits_to_fp32(bits).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        mag = tl.maximum(mag, tl.where(mask, m, 0))
    mag = tl.max(mag, axis=0)
    bad = mag >= 0x7F800000  # NaN or inf in the row: s = NaN, q = 0
    amax = mag.to(tl.float32, bitcast=True)
    s, up, inv = activation_scales(amax)
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


def _index(t: torch.Tensor):
    return _launch.device_index(t)


def _launch_plain(kernel, grid, args, consts, warps, index, portable: bool = False):
    # cached launches (see _launch.py): the key holds every argument's specialization class;
    # portable: the portable arithmetic's compile options (_portable_math.OPTIONS)
    tag, options = ("portable", PORTABLE_OPTIONS) if portable else ("fused", OPTIONS)
    key = (
        None
        if index is None or _launch.INTERPRET
        else _launch.launch_key(kernel.fn.__name__, tag, index, args, tuple(consts.values()))
    )
    _launch.launch(kernel, grid, args, consts, dict(options, num_warps=warps), key, index)


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.bfloat16 or not t.is_contiguous():
        raise ValueError(f"expected a contiguous bf16 tensor, got {t.dtype} {tuple(t.shape)}")
    return t.view(torch.int16)


def add_rms_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    delta: torch.Tensor | None = None,
    quantize: bool = True,
    write_h: bool = False,
    rows: torch.Tensor | None = None,
):
    """x bf16 [T, n] (updated in place to bf16(x + delta) when delta is given), w bf16 [n].
    For each output row i (row rows[i] of x, or i): h = RMSNorm(x) (module docstring), and if
    `quantize` its per-token int8 quantization. Returns (h bf16 [R, n] or None, q int8 [R, n]
    or None, s fp32 [R, 1] or None), R = len(rows) or T."""
    index = _index(x)
    t, n = x.shape
    r = t if rows is None else rows.shape[0]
    dev = x.device
    h = torch.empty((r, n), dtype=torch.bfloat16, device=dev) if write_h else None
    q = torch.empty((r, n), dtype=torch.int8, device=dev) if quantize else None
    s = torch.empty((r, 1), dtype=torch.float32, device=dev) if quantize else None
    if r == 0:
        return h, q, s
    xb = _bits(x)
    args = (
        xb,
        _bits(delta) if delta is not None else xb,
        _bits(w),
        _bits(h) if write_h else xb,
        q if quantize else xb,
        s if quantize else xb,
        rows if rows is not None else xb,
        n,
        float(eps),
    )
    block = row_block(n)
    consts = {
        "BLOCK": block,
        "HAS_D": delta is not None,
        "WRITE_H": write_h,
        "QUANT": quantize,
        "ROW_MAP": rows is not None,
    }
    _launch_plain(_add_rms_norm_kernel, (r, 1, 1), args, consts, _warps(block), index)
    return h, q, s


def qk_norm_rope(
    qkv,
    q_w,
    k_w,
    cos,
    sin,
    pos,
    rows,
    k_cache,
    v_cache,
    heads: int,
    kv_heads: int,
    eps: float,
) -> torch.Tensor:
    """qkv bf16 [T, (H + 2 KV) * D] (q, k, v side by side); q_w, k_w bf16 [D]; cos, sin fp32
    [positions, D]; pos, rows int32 [T] (each token's position and its KV-cache row); caches
    bf16 [rows, KV, capacity, D]. Writes RoPE(RMSNorm(k)) and v to the cache at (row, pos) and
    returns RoPE(RMSNorm(q)) bf16 [T, H, D]."""
    index = _index(qkv)
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    q = torch.empty((t, heads, d), dtype=torch.bfloat16, device=qkv.device)
    if t == 0:
        return q
    args = (
        _bits(qkv),
        _bits(q_w),
        _bits(k_w),
        cos,
        sin,
        pos,
        rows,
        _bits(k_cache),
        _bits(v_cache),
        _bits(q),
        k_cache.shape[2],
        float(eps),
    )
    consts = {
        "H": heads,
        "KV": kv_heads,
        "D": d,
        "HP": row_block(heads),
        "KVP": row_block(kv_heads),
    }
    # one warp per KV head (up to 8): each head's tree stays inside a warp (no block barriers)
    _launch_plain(
        _qk_norm_rope_kernel,
        (t, 1, 1),
        args,
        consts,
        min(8, row_block(kv_heads)),
        index,
    )
    return q


def silu_mul_quantize(gate_up: torch.Tensor, portable: bool = False):
    """gate_up bf16 [T, 2 I] (gate, then up) -> the quantization of bf16(SiLU(gate) * up):
    (q int8 [T, I], s fp32 [T, 1]). portable: SiLU's exp is the software exp_p, compiled with the
    portable options (kernels/triton/portable.py)."""
    index = _index(gate_up)
    t, n2 = gate_up.shape
    n = n2 // 2
    q = torch.empty((t, n), dtype=torch.int8, device=gate_up.device)
    s = torch.empty((t, 1), dtype=torch.float32, device=gate_up.device)
    if t == 0:
        return q, s
    act = torch.empty((t, n), dtype=torch.int16, device=gate_up.device)  # bf16 bits of the product
    _launch_plain(
        _silu_mul_quantize_kernel,
        (t, 1, 1),
        (_bits(gate_up), act, q, s, n),
        {"BLOCK_K": SILU_BLOCK_K, "PORTABLE": portable},
        4,
        index,
        portable,
    )
    return q, s
