"""The reference engine's numerical building blocks in torch, beside the other torch forms of
kernels/ (the whole contract: docs/runtime.md).
Each function states its arithmetic and whether a row's result can depend on
the other rows of the call.

Two reductions are written as a fixed pairwise tree of elementwise adds (`tree_sum_halves`):
element i is added to element i + n/2, then the halves again, down to one. Elementwise
IEEE adds round the same way on any device and for any tensor shape, so a tree sum of a
row depends on that row alone, never on how many rows the call holds or how a library
splits a reduction; zero padding to the next power of two is exact (x + 0 = x).
"""

from __future__ import annotations

import torch

# Rows per dense fp32 matmul call: every call has this many rows (zero-padded), so the
# BLAS library picks the same kernel whatever the batch (see dense_rows).
DENSE_CHUNK = 64


def tree_sum_halves(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept, size 1) by the fixed pairwise tree of the module docstring."""
    dim = dim % x.dim()
    n = x.shape[dim]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        pad = list(x.shape)
        pad[dim] = p - n
        x = torch.cat([x, x.new_zeros(pad)], dim=dim)
    while p > 1:
        p //= 2
        x = x.narrow(dim, 0, p) + x.narrow(dim, p, p)
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, tree: bool = False) -> torch.Tensor:
    """Qwen3's RMSNorm over the last dim: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), all in fp32.

    tree=False: mean(x^2) is torch's own reduction (transformers' formula). On CPU torch
    reduces each row serially at these sizes (a row's bits do not depend on the number of
    rows: measured by the batch-invariance tests); on CUDA its reduction kernel chooses
    threads per row from the number of rows, so the bits of a row can change with the batch.
    tree=True: the sum of squares is tree_sum_halves (invariant by construction on every device),
    divided by the row length (an IEEE division by a tensor)."""
    xf = x.to(torch.float32)
    if tree:
        ss = tree_sum_halves(xf * xf, -1)
        var = ss / torch.full_like(ss, float(xf.shape[-1]))
    else:
        var = xf.pow(2).mean(-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return (weight.to(torch.float32) * xf.to(x.dtype).to(torch.float32)).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [T, 1, head_dim] for rotate-half RoPE at the given positions.
    inv_freq = 1 / theta^(2i/d) and angle = position * inv_freq, both fp32 (transformers'
    formula); elementwise, so a position's table never depends on the other positions."""
    d = head_dim
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d))
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> bf16(x * cos + rotate_half(x) * sin), in fp32, one rounding at the end."""
    d = x.shape[-1]
    xf = x.to(torch.float32)
    rot = torch.cat([-xf[..., d // 2 :], xf[..., : d // 2]], dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The Qwen3 MLP's activation, bf16(silu(fp32(gate)) * fp32(up)), elementwise. On the CPU torch's
    SiLU computes a tensor's last numel mod 32 elements on a scalar path whose exp can differ by an
    ulp: a row's bits are position-free where the width is a multiple of 32 (docs/runtime.md)."""
    return (torch.nn.functional.silu(gate.to(torch.float32)) * up.to(torch.float32)).to(torch.bfloat16)


def rope(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate-half RoPE on [T, H, D] (positions default to 0..T-1), in fp32, cast back."""
    if positions is None:
        positions = torch.arange(x.shape[0], device=x.device)
    cos, sin = rope_tables(positions, x.shape[-1], theta)
    return apply_rope(x, cos, sin)


def dense_rows(x: torch.Tensor, w32: torch.Tensor, chunk: int = DENSE_CHUNK) -> torch.Tensor:
    """bf16(fp32(x) @ w32^T) for a Linear that is not quantized; x [M, K], w32 fp32 [N, K].

    Batch invariance: cuBLAS and MKL pick a kernel (tile, split-K, GEMV for one row) by the
    shape, so the same row could round differently in calls of different M. Here every call
    is exactly [chunk, K] @ [K, N] (the last block zero-padded, from one reused buffer), so
    every row of every batch goes through the same kernel. That a row's result inside one
    such call does not depend on the other rows (no cross-row arithmetic, the same K order
    in every tile) is how GEMM kernels work; the batch-invariance tests measure it."""
    m, k = x.shape
    out = torch.empty(m, w32.shape[0], dtype=torch.bfloat16, device=x.device)
    buf = torch.zeros(chunk, k, dtype=torch.float32, device=x.device)
    for i in range(0, m, chunk):
        n = min(chunk, m - i)
        if n < chunk:
            buf[n:].zero_()
        buf[:n] = x[i : i + n]
        out[i : i + n] = (buf @ w32.T)[:n]
    return out


def attend_prompt(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of ONE prompt (prefill): q [T, H, D], k, v [T, KV, D] (bf16, after
    norms and RoPE) -> bf16 [T, H*D].

    fp32: scores = (q @ k^T) * scale, causal -inf mask, softmax, probabilities rounded to
    bf16 (as transformers' bf16 model does before P @ V), out = P @ V rounded to bf16. GQA:
    head h reads KV head h // (H / KV). The shapes depend on this prompt alone, so running
    it alone or inside a batch calls the same kernels on the same data."""
    t, heads, d = q.shape
    group = heads // k.shape[1]
    qh = q.transpose(0, 1).to(torch.float32)  # [H, T, D]
    kh = k.transpose(0, 1).to(torch.float32).repeat_interleave(group, dim=0)
    vh = v.transpose(0, 1).to(torch.float32).repeat_interleave(group, dim=0)
    scores = (qh @ kh.transpose(1, 2)) * scale
    idx = torch.arange(t, device=q.device)
    scores = scores.masked_fill(idx[None, :] > idx[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(torch.bfloat16).to(torch.float32)
    return (probs @ vh).to(torch.bfloat16).transpose(0, 1).reshape(t, heads * d)


def attend_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """One decode step for B sequences at once: q [B, H, D] bf16; k_cache, v_cache
    [B, KV, L, D] bf16 (positions >= lengths[b] are zeros); lengths [B] (the new token
    included) -> bf16 [B, H*D].

    fp32, every reduction a tree_sum_halves: scores_l = tree_D(q * k_l) * scale; -inf beyond the
    length; m = max (exact); e = exp(s - m); P = bf16(e / tree_L(e)); out = tree_L(P * v) + 0.
    Invariant by construction: every op is elementwise or a tree over one sequence's own
    row, and the padding beyond a sequence's length (to the batch's longest, rounded up to a
    power of two) contributes exact zeros, which leave a tree sum unchanged; the final + 0
    turns a -0 sum into +0 (the only bits a padded zero could change)."""
    b, heads, d = q.shape
    kv = k_cache.shape[1]
    group = heads // kv
    L = k_cache.shape[2]
    qf = q.reshape(b, kv, group, 1, d).to(torch.float32)
    scores = tree_sum_halves(qf * k_cache.to(torch.float32).unsqueeze(2), -1).squeeze(-1) * scale  # [B, KV, G, L]
    valid = torch.arange(L, device=q.device)[None, :] < lengths.reshape(-1, 1)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    probs = (e / tree_sum_halves(e, -1)).to(torch.bfloat16).to(torch.float32)
    out = (
        tree_sum_halves(probs.unsqueeze(-1) * v_cache.to(torch.float32).unsqueeze(2), -2).squeeze(-2) + 0.0
    )  # [B, KV, G, D]
    return out.to(torch.bfloat16).reshape(b, heads * d)
