"""The portable arithmetic, in torch: the executable specification of the portable engine.

Every function here is a fixed sequence of IEEE-754 fp32 (or float64) additions, multiplications,
divisions, square roots, floors, comparisons and selections, each in its own torch call (one
rounding each, nothing contracted), so it gives the same bits on any CPU and on CUDA. The Triton
kernels of kernels/triton/portable.py compute the same operations in the same order (compiled
with enable_fp_fusion=False); tests compare them bit for bit. The specification in words:
docs/runtime.md, "The portable arithmetic".

    exp2(x), exp(x)                      fp32, software (range reduction, degree-9 polynomial)
    rope_tables(positions, head_dim, theta)  fp32 cos, sin [P, D] from float64 + and * only
    lane_dot(a, b)                       fp32 dot over the last axis: LANES lanes, then a tree
    attention(q, k_cache, v_cache, pos, rows, scale)  bf16 [T, H * D]
    silu_mul(gate_up)                    bf16 SiLU(g) * u (then kernels.reference's quantization)
    dense(x, w)                          fp32 [M, N] holding bf16(lane_dot(x, w))
"""

from __future__ import annotations

import math

import torch

from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.math64 import exp64, log64

__all__ = [
    "LANES",
    "SPLIT",
    "TILE",
    "attention",
    "dense",
    "exp",
    "exp2",
    "lane_dot",
    "rope_tables",
    "silu_mul",
    "tree_sum",
]

ARITHMETIC = "portable/1"  # the name a generation record carries (bump on any change below)
LANES = 32  # dot products: lane l sums elements l, l + LANES, ... in order, then a tree over lanes
TILE = 16  # attention: KV positions per online-softmax step
SPLIT = 512  # attention: KV positions per split (absolute boundaries)

# exp: 1/i! for i = 9 .. 0 rounded to fp32 (Horner order); Cody-Waite constants.
EXP_POLY = tuple(float(torch.tensor(1.0 / math.factorial(i), dtype=torch.float32)) for i in range(9, -1, -1))
LN2 = float(torch.tensor(math.log(2.0), dtype=torch.float32))
LOG2E = float(torch.tensor(1.0 / math.log(2.0), dtype=torch.float32))
LN2_HI = 0.693359375  # 9 significant bits: k * LN2_HI is exact for |k| < 2**15
LN2_LO = float(torch.tensor(math.log(2.0) - 0.693359375, dtype=torch.float32))
TINY_ARG = 2.0**-30  # |x| below: treated as 0 (exp of it rounds to 1 anyway); no subnormal reaches floor
CANONICAL_NAN = 0x7FC00000


def _f32(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, v, dtype=torch.float32)


def _finish(x: torch.Tensor, k: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    # p = poly(r) by Horner (separate * and +); result p * 2**k for -125 <= k <= 127 (2**k built
    # from its exponent bits), 0 below, inf above, the canonical NaN for a NaN argument.
    p = _f32(EXP_POLY[0], r)
    for c in EXP_POLY[1:]:
        p = p * r
        p = p + c
    kc = torch.where(k < -125.0, _f32(-125.0, k), torch.where(k > 127.0, _f32(127.0, k), k))
    kc = torch.where(k != k, _f32(0.0, k), kc)
    scale = ((kc.to(torch.int32) + 127) << 23).view(torch.float32)
    y = p * scale
    y = torch.where(k < -125.0, _f32(0.0, y), y)
    y = torch.where(k > 127.0, _f32(math.inf, y), y)
    nan = torch.full((), CANONICAL_NAN, dtype=torch.int32, device=y.device).view(torch.float32)  # no host copy
    return torch.where(x != x, nan, y)


def exp2(x: torch.Tensor) -> torch.Tensor:
    """2**x for fp32 x: x' = 0 if |x| < 2**-30 else x; k = floor(x'); f = x' - k (exact);
    r = f * LN2; p = sum_{i<=9} r**i / i! (Horner, fp32 coefficients); p * 2**k (0 when k < -125)."""
    x = x.to(torch.float32)
    xs = torch.where(x.abs() < TINY_ARG, _f32(0.0, x), x)
    k = torch.floor(xs)
    f = xs - k
    r = f * LN2
    return _finish(x, k, r)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e**x for fp32 x: x' as in exp2; k = floor(x' * LOG2E); r = (x' - k * LN2_HI) - k * LN2_LO;
    then exp2's polynomial and scaling."""
    x = x.to(torch.float32)
    xs = torch.where(x.abs() < TINY_ARG, _f32(0.0, x), x)
    k = torch.floor(xs * LOG2E)
    r = xs - k * LN2_HI
    r = r - k * LN2_LO
    return _finish(x, k, r)


# -- RoPE tables: float64 from + and * only ---------------------------------------------------
_PIO2_1 = 1.57079632673412561417e00  # fdlibm's pi/2 in three parts (the first two with trailing zeros)
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_3 = 2.02226624879595063154e-21
_INV_PIO2 = 6.36619772367581382433e-01
_SIN_C = tuple((-1) ** i / math.factorial(2 * i + 1) for i in range(12, -1, -1))
_COS_C = tuple((-1) ** i / math.factorial(2 * i) for i in range(12, -1, -1))


def _horner(c, z):
    p = torch.full_like(z, c[0])
    for v in c[1:]:
        p = p * z
        p = p + v
    return p


def _sincos64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x >= 0 float64; k = floor(x * 2/pi + 0.5); r = ((x - k P1) - k P2) - k P3; Taylor in r**2.
    k = torch.floor(x * _INV_PIO2 + 0.5)
    r = x - k * _PIO2_1
    r = r - k * _PIO2_2
    r = r - k * _PIO2_3
    z = r * r
    s = _horner(_SIN_C, z) * r
    c = _horner(_COS_C, z)
    q = k.to(torch.int64) % 4
    sin = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    cos = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    return sin, cos


def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # theta ** (-2i / d) = exp64(-(2i / d) * log64(theta)): + * / only (no libm), as the sampler
    lt = log64(float(theta))
    e = torch.tensor([-(2.0 * i / head_dim) * lt for i in range(head_dim // 2)], dtype=torch.float64)
    return exp64(e)


def rope_tables(length: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [length, head_dim] on the CPU: angle = float64(p * inv_freq_i) with
    inv_freq_i = theta ** (-2i/d) and sin/cos evaluated in float64 from + and * only, each rounded
    once to fp32; columns i and i + d/2 equal (rotate-half). Move the result to the device."""
    inv = _inv_freq(head_dim, theta)
    ang = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    sin, cos = _sincos64(ang)
    cos = torch.cat([cos, cos], 1).to(torch.float32).contiguous()
    sin = torch.cat([sin, sin], 1).to(torch.float32).contiguous()
    return cos, sin


# -- sums and dot products ------------------------------------------------------------------
def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The adjacent pairwise tree over `dim` (a power of two; removed): 2j + (2j + 1), halving."""
    x = x.movedim(dim, -1)
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def lane_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_k a[..., k] * b[..., k] (broadcast; fp32 products of bf16 values are exact): K padded
    with zeros to a multiple of LANES; lane l accumulates a[c L + l] * b[c L + l] for c = 0, 1, ...
    from +0, one fp32 add each; then tree_sum over the LANES lanes."""
    k = a.shape[-1]
    pad = -k % LANES
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
        b = torch.nn.functional.pad(b, (0, pad))
    acc = None
    for c in range(0, k + pad, LANES):
        prod = a[..., c : c + LANES] * b[..., c : c + LANES]
        acc = (torch.zeros_like(prod) if acc is None else acc) + prod
    return tree_sum(acc, -1)


# -- attention --------------------------------------------------------------------------------
def _attend_rows(q, kc, vc, pos, crow, qk_scale, split):
    """q fp32 [T, H, D]; kc, vc bf16 caches [rows, KV, cap, D]; pos, crow int64 [T]."""
    t, heads, d = q.shape
    kv = kc.shape[1]
    g = heads // kv
    cap = kc.shape[2]
    hi = int(pos.max()) + 1
    parts = []
    for lo in range(0, hi, split):
        m = torch.full((t, heads), -math.inf)
        l_sum = torch.zeros((t, heads))
        acc = torch.zeros((t, heads, d))
        for n0 in range(lo, min(lo + split, hi), TILE):
            n = n0 + torch.arange(TILE)
            live = n < cap
            nn = torch.where(live, n, torch.zeros_like(n))
            k = kc[crow[:, None], :, nn[None, :]].to(torch.float32)  # [T, TILE, KV, D]
            v = vc[crow[:, None], :, nn[None, :]].to(torch.float32)
            causal = n[None, :] <= pos[:, None]  # [T, TILE]
            k = torch.where(causal[:, :, None, None], k, torch.zeros_like(k))
            v = torch.where(causal[:, :, None, None], v, torch.zeros_like(v))
            k = k.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)  # [T, H, TILE, D]
            v = v.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
            s = lane_dot(q[:, :, None, :], k) * qk_scale  # [T, H, TILE]
            cz = causal[:, None, :].expand_as(s)
            s = torch.where(cz, s, torch.full_like(s, -math.inf))
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.where(m_new == m, torch.ones_like(m), exp2(m - m_new))
            p = torch.where(cz, exp2(s - m_new[..., None]), torch.zeros_like(s))
            upd = (n0 <= pos)[:, None].expand_as(m)
            l_sum = torch.where(upd, l_sum * alpha + tree_sum(p, -1), l_sum)
            pb = round_fp32_to_bf16(p).to(torch.float32)
            pv = pb[..., None] * v  # [T, H, TILE, D]; exact; masked positions are +0
            pv = torch.where(cz[..., None], pv, torch.zeros_like(pv))
            acc = torch.where(upd[..., None], acc * alpha[..., None] + tree_sum(pv, 2), acc)
            m = torch.where(upd, m_new, m)
        parts.append((m, l_sum, acc))
    m, l_sum, acc = parts[0]
    for j, (mj, lj, aj) in enumerate(parts[1:], 1):
        inc = (pos >= j * split)[:, None].expand_as(m)
        m_new = torch.maximum(m, mj)
        alpha = torch.where(m_new == m, torch.ones_like(m), exp2(m - m_new))
        beta = torch.where(m_new == mj, torch.ones_like(m), exp2(mj - m_new))
        l_sum = torch.where(inc, l_sum * alpha + lj * beta, l_sum)
        acc = torch.where(inc[..., None], acc * alpha[..., None] + aj * beta[..., None], acc)
        m = torch.where(inc, m_new, m)
    return round_fp32_to_bf16(acc / l_sum[..., None])


def attention(q, k_cache, v_cache, pos, rows, scale: float, split: int | None = None, chunk: int = 32):
    """Causal attention of q bf16 [T, H, D] (token i at position pos[i] of cache row rows[i]) over
    the bf16 caches [rows, KV, capacity, D] (every position <= pos[i] written): bf16 [T, H * D].
    Per query row: splits of SPLIT absolute positions; in each, tiles of TILE ascending from
    (m, l, acc) = (-inf, 0, 0): s = lane_dot(q, k) * fp32(scale * log2 e), -inf past the row's
    position; m' = max(m, max s); alpha = 1 if m' == m else exp2(m - m'); p = exp2(s - m') (0 when
    masked); l = l * alpha + tree_sum(p); acc = acc * alpha + tree_sum over the tile of bf16(p) * v;
    a tile wholly past the row's position changes nothing. Splits 1.. fold into split 0 in
    ascending order (M' = max, a = exp2(M - M'), b = exp2(m_j - M'), each 1 when equal; L = L a +
    l_j b; A = A a + acc_j b); out = bf16(A / L). Rows are processed `chunk` tokens at a time."""
    split = SPLIT if split is None else split
    qk_scale = float(torch.tensor(scale * 1.4426950408889634, dtype=torch.float32))
    t, heads, d = q.shape
    out = torch.empty((t, heads, d), dtype=torch.bfloat16)
    qf = q.to(torch.float32)
    pos = pos.to(torch.int64)
    rows = rows.to(torch.int64)
    for a in range(0, t, chunk):
        b = min(t, a + chunk)
        out[a:b] = _attend_rows(qf[a:b], k_cache, v_cache, pos[a:b], rows[a:b], qk_scale, split)
    return out.reshape(t, heads * d)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up bf16 [T, 2 I] -> bf16(fp32(g / (1 + exp(-g))) * u), IEEE division, exp above."""
    n = gate_up.shape[1] // 2
    g = gate_up[:, :n].to(torch.float32)
    u = gate_up[:, n:].to(torch.float32)
    e = exp(-g)
    return round_fp32_to_bf16((g / (e + 1.0)) * u)


def prepare_dense(w: torch.Tensor) -> torch.Tensor:
    """A bf16 weight [N, K] as fp32 [K / LANES, N, LANES] (K zero-padded): dense_prepared's layout."""
    n, k = w.shape
    wf = w.to(torch.float32)
    if k % LANES:
        wf = torch.nn.functional.pad(wf, (0, -k % LANES))
    return wf.reshape(n, -1, LANES).permute(1, 0, 2).contiguous()


def dense_prepared(x: torch.Tensor, wp: torch.Tensor, block_n: int = 32768) -> torch.Tensor:
    """dense(x, w) with w given as prepare_dense(w): the same operations (lane l accumulates chunk
    after chunk from +0, product and add each rounded), then tree_sum over the lanes and one bf16
    rounding."""
    chunks, n, _ = wp.shape
    m, k = x.shape
    xf = x.to(torch.float32)
    if k % LANES:
        xf = torch.nn.functional.pad(xf, (0, -k % LANES))
    xf = xf.reshape(m, chunks, 1, LANES)
    out = torch.empty((m, n), dtype=torch.float32)
    for n0 in range(0, n, block_n):
        wb = wp[:, n0 : n0 + block_n]
        acc = torch.zeros((m, wb.shape[1], LANES), dtype=torch.float32)
        for c in range(chunks):
            acc.add_(xf[:, c] * wb[c])  # a separate product: an underflowing one rounds as on the GPU
        out[:, n0 : n0 + block_n] = round_fp32_to_bf16(tree_sum(acc, -1)).to(torch.float32)
    return out


def dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [M, K], w bf16 [N, K] -> fp32 [M, N] holding bf16(lane_dot(x[m], w[n]))."""
    return dense_prepared(x, prepare_dense(w))
