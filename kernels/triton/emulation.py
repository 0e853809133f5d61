"""Torch emulations of the fast engine's fused row kernels (fused.py, beside this module): the
independent references the kernels are compared with, bit for bit, on the CPU (the kernels
under TRITON_INTERPRET=1) and on a GPU. Each states the same arithmetic as its kernel, written
with torch's elementwise IEEE operations (one rounding each) and the adjacent pairwise tree
`tree_sum_adjacent`; the activation quantization is kernels.reference's own. The attention and
dense kernels have no bitwise emulation (their MMAs sum in the hardware's order): their tests
compare them with themselves across blocks and batches (docs/runtime.md).
"""

from __future__ import annotations

import numpy as np
import torch

from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.reference import quantize_activations

__all__ = [
    "add_rms_norm_ref",
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


def rms_norm_ieee(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(w * bf16(x * r)), r = 1 / sqrt(tree_sum_adjacent(x * x) / n + eps): IEEE division and
    square root (the fused kernels' RMSNorm), over the last dim; fp32 arithmetic."""
    xf = x.to(torch.float32)
    ss = tree_sum_adjacent(xf * xf, -1)
    var = ss / torch.full_like(ss, float(xf.shape[-1]))
    r = torch.ones_like(var) / torch.sqrt(var + eps)
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
