"""The portable engine's Triton kernels: the arithmetic of kernels/portable.py (its torch
specification) on a GPU, operation for operation.

    exp2_p(x), exp_p(x)        software exp2 / exp from IEEE fp32 operations (_portable_math.py)
    attention(q, k_cache, v_cache, pos, blocks, scale) -> bf16 [T, H * D]
                               (attention.py's split + combine kernels with PORTABLE=True)
    silu_mul_quantize(gate_up) -> (q int8 [T, I], s fp32 [T, 1])
                               (fused.py's SiLU kernel with PORTABLE=True)
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
from requant.kernels.triton import _launch, fused
from requant.kernels.triton import attention as _attention
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton._portable_math import OPTIONS, exp2_p, exp_p
from requant.kernels.triton.fused import bits_to_fp32, tree_sum_rows

__all__ = ["OPTIONS", "attention", "block_m", "dense", "exp2_p", "exp_p", "silu_mul_quantize", "tokens_per_block"]


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
# Query tokens an attention program holds when a launch has blocks of several tokens (prefill; a
# launch of one-token blocks, decode, always holds one). None: as many as fill block_m's rows (one
# token at Qwen3's 4 query heads per KV head). A program reads each KV tile once for all its tokens;
# a row's arithmetic never depends on the other rows (docstring above), so this changes speed, never
# bits (tests/kernels/test_portable.py draws it). Chosen by `benchmarks/bench_portable.py --tokens`.
PREFILL_TOKENS: int | None = None
WARPS = 4  # of every portable attention launch (split and combine)


def _block_rows(g: int, tokens: int) -> int:
    return max(2, 1 << max(g * tokens - 1, 0).bit_length())


def block_m(heads: int, kv_heads: int) -> int:
    """Rows of a one-token attention program: the query heads of one KV head, padded to a power of two >= 2."""
    return _block_rows(heads // kv_heads, 1)


def tokens_per_block(heads: int, kv_heads: int) -> int:
    """Query tokens per block of a prefill launch (PREFILL_TOKENS, or as many as fill block_m)."""
    if PREFILL_TOKENS is not None:
        if PREFILL_TOKENS < 1:
            raise ValueError(f"PREFILL_TOKENS must be >= 1, got {PREFILL_TOKENS}")
        return PREFILL_TOKENS
    return block_m(heads, kv_heads) // (heads // kv_heads)


def _launch_cfg(kernel, name, grid, args, consts, warps, index):
    key = (
        None
        if index is None or _launch.INTERPRET
        else _launch.launch_key(name, "portable", index, args, tuple(consts.values()))
    )
    _launch.launch(kernel, grid, args, consts, dict(OPTIONS, num_warps=warps), key, index)


def attention(q, k_cache, v_cache, pos, blocks, scale: float, split: int | None = None) -> torch.Tensor:
    """kernels.portable.attention on the device. q bf16 [T, H, D]; caches bf16 [rows, KV, cap, D];
    pos int32 [T]; blocks int32 [NB, 3] = (first token, count <= tokens_per_block, cache row).
    The fast engine's split + combine kernels with PORTABLE=True (kernels/triton/attention.py)."""
    index = _launch.device_index(q)
    split = spec.SPLIT if split is None else split
    t, heads, d = q.shape
    out = torch.empty((t, heads * d), dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    kv = k_cache.shape[1]
    # as many blocks as tokens: every block one token (decode), read from the shapes (no sync)
    tokens = 1 if blocks.shape[0] == t else tokens_per_block(heads, kv)
    bm = _block_rows(heads // kv, tokens)
    qk_scale = float(torch.tensor(scale * 1.4426950408889634, dtype=torch.float32))
    _attention._split_combine(
        q, k_cache, v_cache, pos, blocks, out, qk_scale, bm, spec.TILE, split, WARPS, None, index, True
    )
    return out


# -- SiLU and the lm_head ------------------------------------------------------------------------
def silu_mul_quantize(gate_up: torch.Tensor):
    """gate_up bf16 [T, 2 I] -> quantize_activations(kernels.portable.silu_mul(gate_up)): the fast
    engine's SiLU kernel with the software exp (fused.silu_mul_quantize(portable=True))."""
    return fused.silu_mul_quantize(gate_up, portable=True)


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
