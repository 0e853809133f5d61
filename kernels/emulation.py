"""Torch emulations of the fast engine's fused row kernels (kernels/triton/fused.py): the
independent references the kernels are compared with, bit for bit, on the CPU (the kernels
under TRITON_INTERPRET=1) and on a GPU. Each states the same arithmetic as its kernel, written
with torch's elementwise IEEE operations (one rounding each; torch and numpy only, no Triton: beside
kernels/reference.py and kernels/portable.py, the other torch forms) and the adjacent pairwise tree
`tree_sum_adjacent`; the activation quantization is kernels.reference's own. `attention_ref` is
the split-KV attention (kernels/triton/attention.py) as the interpreter runs it: numpy float32 operations on the
kernel's tile shapes, its dot products summed in ascending order (what the kernel's interpreter
path asks numpy for), exp2 numpy's; on a GPU the MMA's order and exp2 differ, so there the
kernel is compared with itself across blocks, chunks and batches (docs/runtime.md). The dense
kernel has no bitwise emulation (its MMA sums in the hardware's order).
"""

from __future__ import annotations

import numpy as np
import torch

from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.reference import quantize_activations

__all__ = [
    "add_rms_norm_ref",
    "attention_ref",
    "tree_sum_adjacent",
    "qk_norm_rope_ref",
    "rms_norm_ieee",
    "silu_mul_quantize_ref",
]


def tree_sum_adjacent(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept, size 1) by the adjacent pairwise tree of the fused kernels: zero
    padding to a power of two, then element 2j plus element 2j + 1, repeatedly, down to one."""
    dim = dim % x.dim()
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        x = torch.cat([x, x.new_zeros((*x.shape[:-1], p - n))], dim=-1)
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x.movedim(-1, dim)


def sqrt_rn(v: torch.Tensor) -> torch.Tensor:
    """fp32 square root rounded once to nearest (IEEE sqrt), whatever the library's: torch 2.13's
    float32 CPU sqrt is not (1 ulp off in about 20% of random inputs on CI's AVX-512 AMD EPYC), and
    the replay of a GPU record on a CPU depends on it. A float64 square root gives a candidate; the
    exact choice between it and a neighbour follows from their midpoint (25 significant bits, so its
    square is exact in float64; a square root never lands on a midpoint)."""
    v = v.to(torch.float32)
    c = torch.sqrt(v.to(torch.float64)).to(torch.float32)
    v64 = v.to(torch.float64)
    up = torch.nextafter(c, torch.full_like(c, float("inf")))
    mid = (c.to(torch.float64) + up.to(torch.float64)) / 2
    c = torch.where(mid * mid < v64, up, c)
    dn = torch.nextafter(c, torch.zeros_like(c))
    mid = (dn.to(torch.float64) + c.to(torch.float64)) / 2
    c = torch.where(mid * mid > v64, dn, c)
    regular = torch.isfinite(v) & (v > 0)
    return torch.where(regular, c, torch.sqrt(v))


def rms_norm_ieee(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(w * bf16(x * r)), r = 1 / sqrt(tree_sum_adjacent(x * x) / n + eps): IEEE division and
    square root (the fused kernels' RMSNorm), over the last dim; fp32 arithmetic."""
    xf = x.to(torch.float32)
    ss = tree_sum_adjacent(xf * xf, -1)
    var = ss / torch.full_like(ss, float(xf.shape[-1]))
    r = torch.ones_like(var) / sqrt_rn(var + eps)
    xn = round_fp32_to_bf16(xf * r).to(torch.float32)
    return round_fp32_to_bf16(w.to(torch.float32) * xn)


def add_rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float, delta: torch.Tensor | None = None):
    """(bf16(x + delta) or x, h = rms_norm_ieee(that), (q, s) = quantize_activations(h))."""
    if delta is not None:
        x = round_fp32_to_bf16(x.to(torch.float32) + delta.to(torch.float32))
    h = rms_norm_ieee(x, w, eps)
    q, s = quantize_activations(h, check=False)
    return x, h, q, s


def qk_norm_rope_ref(qkv, q_w, k_w, cos, sin, pos, heads: int, kv_heads: int, eps: float):
    """(q, k, v) [T, heads or kv_heads, D] bf16: RoPE(RMSNorm(q)), RoPE(RMSNorm(k)), v, with
    cos/sin gathered at pos from the [positions, D] tables."""
    t = qkv.shape[0]
    d = cos.shape[-1]
    q = qkv[:, : heads * d].reshape(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].reshape(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].reshape(t, kv_heads, d)
    c = cos[pos.long()][:, None, :]
    s = sin[pos.long()][:, None, :]

    def rope(y):
        yf = y.to(torch.float32)
        rot = torch.cat([-yf[..., d // 2 :], yf[..., : d // 2]], dim=-1)
        return round_fp32_to_bf16(yf * c + rot * s)

    return (
        rope(rms_norm_ieee(q, q_w, eps)),
        rope(rms_norm_ieee(k, k_w, eps)),
        v.contiguous(),
    )


def silu_mul_quantize_ref(gate_up: torch.Tensor):
    """quantize_activations(bf16(fp32(g / (1 + exp(-g))) * u)); exp is numpy's float32 exp,
    the one the Triton interpreter uses (a GPU uses its own approximation)."""
    n = gate_up.shape[1] // 2
    g = gate_up[:, :n].to(torch.float32)
    u = gate_up[:, n:].to(torch.float32)
    e = torch.from_numpy(np.exp(-g.cpu().numpy())).to(g.device)
    act = round_fp32_to_bf16((g / (1.0 + e)) * u)
    return quantize_activations(act, check=False)


def _dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + sum_k a[:, k, None] * b[None, k, :]: the exact fp32 products of [M, K] x [K, N],
    summed over k by numpy's reduction of the broadcast [M, K, N] product (a middle axis:
    ascending k), then added to acc: the kernel's interpreter dot."""
    shape = (a.shape[0], a.shape[1], b.shape[1])
    prod = np.broadcast_to(a[:, :, None], shape) * np.broadcast_to(b[None, :, :], shape)
    return acc + np.sum(prod, axis=1)


def _bf16_f32(x: np.ndarray) -> np.ndarray:
    return round_fp32_to_bf16(torch.from_numpy(x)).to(torch.float32).numpy()


def attention_ref(q, k_cache, v_cache, pos, blocks, scale: float, split: int, block_m: int = 64, block_n: int = 64):
    """bf16 [T, H * D]: attention.attention's result (splits of `split` positions, tiles of
    block_n, blocks of block_m rows), restated program by program: each split's online-softmax
    walk from (-inf, 0, 0), then the left fold of splits 0 .. pos // split in ascending order,
    then bf16(acc / l)."""
    t, heads, d = q.shape
    kv = k_cache.shape[1]
    g = heads // kv
    qk_scale = np.float32(scale * 1.4426950408889634)
    qf = q.to(torch.float32).numpy()
    kf = k_cache.to(torch.float32).numpy()
    vf = v_cache.to(torch.float32).numpy()
    pos = pos.to(torch.int64).numpy()
    out = torch.zeros((t, heads, d), dtype=torch.bfloat16)
    r = np.arange(block_m)
    for tok0, ntok, crow in blocks.tolist():
        valid = r // g < ntok
        tok = tok0 + np.where(valid, r // g, 0)
        rpos = np.where(valid, pos[tok], 0)
        hi = int(pos[tok0 + ntok - 1]) + 1
        for kvh in range(kv):
            head = kvh * g + r % g
            qb = np.ascontiguousarray(qf[tok, head])  # [block_m, D]
            parts = []
            for lo in range(0, hi, split):
                m = np.full(block_m, -np.inf, np.float32)
                l_sum = np.zeros(block_m, np.float32)
                acc = np.zeros((block_m, d), np.float32)
                for n0 in range(lo, min(lo + split, hi), block_n):
                    n = n0 + np.arange(block_n)
                    live = (n < hi)[:, None]
                    nn = np.minimum(n, kf.shape[2] - 1)
                    k = np.where(live, kf[crow, kvh, nn], np.float32(0))
                    v = np.where(live, vf[crow, kvh, nn], np.float32(0))
                    s = _dot(qb, np.ascontiguousarray(k.T), np.zeros((block_m, block_n), np.float32)) * qk_scale
                    causal = n[None, :] <= rpos[:, None]
                    s = np.where(causal, s, np.float32(-np.inf))
                    m_new = np.maximum(m, np.max(s, axis=1))
                    with np.errstate(invalid="ignore"):
                        alpha = np.where(m_new == m, np.float32(1), np.exp2(m - m_new))
                        p = np.where(causal, np.exp2(s - m_new[:, None]), np.float32(0))
                    l_sum = l_sum * alpha + np.sum(p, axis=1)
                    acc = _dot(_bf16_f32(p), v, acc * alpha[:, None])
                    m = m_new
                parts.append((m, l_sum, acc))
            m, l_sum, acc = parts[0]
            for j, (mj, lj, aj) in enumerate(parts[1:], 1):
                inc = valid & (rpos >= j * split)
                mj = np.where(inc, mj, np.float32(0))  # the kernel's fillers for rows without split j
                lj = np.where(inc, lj, np.float32(0))
                aj = np.where(inc[:, None], aj, np.float32(0))
                m_new = np.maximum(m, mj)
                alpha = np.where(m_new == m, np.float32(1), np.exp2(m - m_new))
                beta = np.where(m_new == mj, np.float32(1), np.exp2(mj - m_new))
                l_sum = np.where(inc, l_sum * alpha + lj * beta, l_sum)
                acc = np.where(inc[:, None], acc * alpha[:, None] + aj * beta[:, None], acc)
                m = np.where(inc, m_new, m)
            res = round_fp32_to_bf16(torch.from_numpy(np.divide(acc, l_sum[:, None])))
            out[tok[valid], head[valid]] = res[torch.from_numpy(valid)]
    return out.reshape(t, heads * d)
