"""A bf16 Linear with one fixed tile (the fast path's dense lm_head), in Triton.

    dense(x, w) -> fp32 [M, N] holding bf16(x @ w^T)

x bf16 [M, K], w bf16 [N, K] (the checkpoint's weights as stored: no fp32 copy).

NUMERICS: bf16 products are exact in fp32; the MMA accumulates them in fp32 over BLOCK_K
slices walked in ascending K; the result is rounded once to bf16 (round to nearest even, on
the bits) and returned as fp32, like the reference path's logits. The reference path does
fp32(x) @ fp32(W)^T through cuBLAS/MKL instead, so the two agree closely, not bitwise.

BATCH INVARIANCE by construction: one tile configuration (BLOCK_M, BLOCK_N, BLOCK_K, warps,
stages) for every M, no split-K, and M is not specialised by Triton (do_not_specialize), so
every row of every call runs the same instructions over its own row of x; rows beyond M are
masked to zero and never stored.
"""

import torch
import triton
import triton.language as tl

from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton.attention import _dot

__all__ = ["BLOCK_K", "BLOCK_M", "BLOCK_N", "dense"]

BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 4


@triton.jit(do_not_specialize=["M"])
def _dense_kernel(
    x_ptr,
    w_ptr,
    o_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # the row blocks of one weight tile run next to each other (L2 reuse)
    pid_n = pid // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m.to(tl.int64)
    cols = offs_n.to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = k0 + offs_k < K
        a = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & km[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=(offs_n[None, :] < N) & km[:, None], other=0.0)
        acc = _dot(a, b, acc, INTERPRET)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    bits = bf16_rne_bits(acc)
    y = (bits.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    tl.store(
        o_ptr + rows[:, None] * N + cols[None, :],
        y,
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


def dense(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring; `out` an optional fp32 [M, N] destination."""
    index = _launch.device_index(x)
    m, k = x.shape
    n = w.shape[0]
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or w.shape[1] != k:
        raise ValueError(
            f"dense: x {x.dtype} {tuple(x.shape)} and w {w.dtype} {tuple(w.shape)} must be bf16 [M, K], [N, K]"
        )
    x = x.contiguous()
    w = w.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m == 0 or n == 0:
        return out
    grid = (-(-m // BLOCK_M) * -(-n // BLOCK_N), 1, 1)
    args = (x, w, out, m, n, k)
    consts = {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "INTERPRET": _launch.INTERPRET,
    }
    key = (
        None
        if index is None or _launch.INTERPRET
        else _launch.launch_key("dense", "fixed", index, args, tuple(consts.values()))
    )
    _launch.launch(
        _dense_kernel,
        grid,
        args,
        consts,
        {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES},
        key,
        index,
    )
    return out
