"""One causal attention kernel for prefill, chunked prefill and decode (the fast path's).

    attention(q, k_cache, v_cache, pos, blocks) -> bf16 [T, H * D]

q bf16 [T, H, D] (after norms and RoPE); k_cache, v_cache bf16 [rows, KV, capacity, D] (the
KV cache, holding every key and value up to each token's position, this call's tokens
included: prefill writes them first); pos int32 [T] each token's absolute position; blocks
int32 [NB, 3] = (first token, token count <= BLOCK_M // G, cache row): the query tokens of a
program, consecutive tokens of one sequence in ascending positions.

One program = one block x one KV head: its BLOCK_M rows are (token, query head) pairs, the
G = H / KV query heads of that KV head for BLOCK_M / G consecutive tokens (GQA packing, so
each K/V tile is loaded once for G heads). Rows beyond the block's tokens are padding
(never stored).

NUMERICS (flash-style online softmax; differs from the reference path's full softmax):
    s    = (q . k) * (scale * log2 e)                 fp32 MMA (bf16 products exact)
    for KV tiles of BLOCK_N positions, ascending from position 0, up to the block's last
    position: m' = max(m, max_j s_j) (masked j: -inf, j > the row's position);
        alpha = 1 if m' == m else exp2(m - m');  p_j = exp2(s_j - m') (0 where masked)
        l = l * alpha + sum_j p_j;  acc = acc * alpha + bf16(p) @ v    (fp32 MMA)
    out  = bf16(acc / l)                                  (IEEE division)
exp2 is the device's (an approximation on a GPU). P is rounded to bf16 before P @ V
unnormalised (flash order), not the normalised probabilities as in the reference path.

INVARIANCE (prefill == chunked prefill == decode, and batch invariance), by construction:
  * every launch uses the same BLOCK_M, BLOCK_N, num_warps and num_stages, so a row's MMA and
    reduction instructions are the same whether the program holds 1 decode token or BLOCK_M/G
    prefill tokens (an MMA output element depends on its own row and column only);
  * a row walks the KV tiles from position 0 in the same order whatever the call; tiles beyond
    its own position (walked because another row of the program needs them) are exact no-ops:
    every s_j is masked, so m' = m, alpha = 1 (forced), p = 0, l * 1 + 0 = l and
    acc * 1 + 0 @ v = acc (v is finite: positions beyond the block's last are loaded as 0);
  * K/V always come from the cache, so prefill and decode read the same bytes;
  * the walk bound is read from device memory (pos), so a CUDA graph replays it unchanged.
The test (tests/requant/runtime/test_fast.py, test_fast_gpu.py) compares a token's
logits prefilled whole, in chunks after a cached prefix and decoded, bit for bit.
"""

import torch
import triton
import triton.language as tl

from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "NUM_STAGES",
    "NUM_WARPS",
    "attention",
    "tokens_per_block",
]

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 2
_LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    # Under Triton 3.9's interpreter, tl.dot multiplies bf16 tiles wrongly, and its fp32
    # matmul (numpy/BLAS) can round a row differently from call to call; there the exact
    # fp32 products are summed by an explicit reduction (a fixed order for a fixed shape).
    # Compiled kernels use the MMA.
    if INTERPRET:
        return acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return tl.dot(a, b, acc)


@triton.jit
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    blocks_ptr,
    cap,
    qk_scale,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    blk = tl.program_id(0)
    kvh = tl.program_id(1)
    tok0 = tl.load(blocks_ptr + blk * 3)
    ntok = tl.load(blocks_ptr + blk * 3 + 1)
    crow = tl.load(blocks_ptr + blk * 3 + 2).to(tl.int64)
    r = tl.arange(0, BLOCK_M)
    ti = r // G
    valid = ti < ntok
    tok = (tok0 + tl.where(valid, ti, 0)).to(tl.int64)
    head = kvh * G + r % G
    pos = tl.where(valid, tl.load(pos_ptr + tok), 0)
    hi = tl.load(pos_ptr + tok0 + ntok - 1) + 1  # the block's last position + 1
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :])
    base = (crow * KV + kvh) * cap * D
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for n0 in range(0, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < hi
        kv_off = base + n.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=live[:, None], other=0.0)
        s = _dot(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERPRET) * qk_scale
        causal = n[None, :] <= pos[:, None]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_new))
        p = tl.where(causal, tl.exp2(s - m_new[:, None]), 0.0)
        l_sum = l_sum * alpha + tl.sum(p, 1)
        pb = bf16_rne_bits(p).to(tl.bfloat16, bitcast=True)
        v = tl.load(v_ptr + kv_off, mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc = _dot(pb, v, acc, INTERPRET)
        m = m_new
    out = tl.math.div_rn(acc, l_sum[:, None])
    tl.store(
        o_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :],
        bf16_rne_bits(out),
        mask=valid[:, None],
    )


def tokens_per_block(heads: int, kv_heads: int) -> int:
    """Query tokens one program holds: BLOCK_M // (heads / kv_heads)."""
    g = heads // kv_heads
    if BLOCK_M % g:
        raise ValueError(f"{heads} query heads per {kv_heads} KV heads: group {g} does not divide BLOCK_M {BLOCK_M}")
    return BLOCK_M // g


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    blocks: torch.Tensor,
    scale: float,
    tile: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """See the module docstring. Returns bf16 [T, H * D]. `tile` = (BLOCK_M, BLOCK_N, warps,
    stages) overrides the fixed tile for the benchmark's price-of-invariance sweep only (blocks
    must then hold BLOCK_M // G tokens at most); the runtime never passes it."""
    bm, bn, warps, stages = tile or (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES)
    index = _launch.device_index(q)
    t, heads, d = q.shape
    kv = k_cache.shape[1]
    out = torch.empty((t, heads * d), dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    g = heads // kv
    tokens_per_block(heads, kv)
    args = (
        q,
        k_cache,
        v_cache,
        out.view(torch.int16),
        pos,
        blocks,
        k_cache.shape[2],
        float(scale * _LOG2E),
    )
    consts = {
        "H": heads,
        "KV": kv,
        "D": d,
        "G": g,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "INTERPRET": _launch.INTERPRET,
    }
    key = (
        None
        if index is None or _launch.INTERPRET
        else _launch.launch_key("attention", (warps, stages), index, args, tuple(consts.values()))
    )
    _launch.launch(
        _attention_kernel,
        (blocks.shape[0], kv, 1),
        args,
        consts,
        {"num_warps": warps, "num_stages": stages},
        key,
        index,
    )
    return out
