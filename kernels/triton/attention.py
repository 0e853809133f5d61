"""One causal attention for prefill, chunked prefill and decode (the fast path's), split-KV.

    attention(q, k_cache, v_cache, pos, blocks) -> bf16 [T, H * D]

q bf16 [T, H, D] (after norms and RoPE); k_cache, v_cache bf16 [rows, KV, capacity, D] holding
every key and value up to each token's position, this call's included; pos int32 [T] absolute
positions; blocks int32 [NB, 3] = (first token, count <= BLOCK_M // G, cache row): consecutive
tokens of one sequence. A block's BLOCK_M rows are (token, query head) pairs: the G = H / KV heads
of one KV head for BLOCK_M / G tokens (GQA packing); rows beyond its tokens are padding.

Split + combine, two kernels. _split_kernel, one program per (block, KV head, split j): split j is the absolute
positions [j * SPLIT, (j + 1) * SPLIT), SPLIT a constant (a multiple of BLOCK_N); the grid's
third axis is ceil(capacity / SPLIT), programs past the block's last position do nothing. Inside
its split a program walks KV tiles of BLOCK_N ascending (flash online softmax, fp32):
    s = (q . k) * (scale * log2 e)   (fp32 MMA; masked: -inf where the position > the row's)
    m' = max(m, max_j s_j); alpha = 1 if m' == m else exp2(m - m'); p_j = exp2(s_j - m')
    l = l * alpha + sum_j p_j;  acc = acc * alpha + bf16(p) @ v     (fp32 MMA)
from m = -inf, l = 0, acc = 0, and stores (m, l, acc) for the rows whose position reaches j.
_combine_kernel, one program per (block, KV head): a row has the splits 0 .. pos // SPLIT; from
split 0's partial it folds splits 1, 2, ... in ascending order, in fp32:
    M' = max(M, m_j); a = 1 if M' == M else exp2(M - M'); b = 1 if M' == m_j else exp2(m_j - M')
    L = L * a + l_j * b;  A = A * a + acc_j * b;  then out = bf16(A / L)    (IEEE division)
exp2 is the device's (an approximation on a GPU). P is rounded to bf16 before P @ V unnormalised.
One split (every position < SPLIT) is the fold's identity: out = bf16(acc_0 / l_0), the
arithmetic of the unsplit walk. The torch emulation: kernels/triton/emulation.py attention_ref.

The fused fold, _fold_kernel, one program per (block, KV head): the same computation without the
partials' round trip through memory. It walks split 0 (the state), then each split j = 1, 2, ...
of the block in ascending order and folds it into the state at once, with the fillers and row
selection of the combine kernel: _split_kernel's walk (_walk) and _combine_kernel's fold step
(_fold) are the same jit functions in both, so each row gets the same fp32 operations in the
same order and the same bits (an fp32 partial stored and loaded is the same value). `fold_path`
picks it from the launch's shape (blocks of several tokens, FOLD_MIN_PROGRAMS programs or more:
prefill, chunked prefill); decode and small launches keep split + combine, whose parallelism
over splits matters there. The grid is (blocks, KV heads), longest blocks first.

Why the bits do not depend on the batch, the chunking or the path (INVARIANCE): docs/internals.md.
Launch groups of blocks (PARTIAL_BUDGET bytes of partials each) change nothing: a block's
programs read only their own partials. Tests: tests/requant/runtime/test_fast.py,
test_attention_fold.py (CPU, interpreter), test_fast_gpu.py, test_attention_fold_gpu.py.
"""

import torch
import triton
import triton.language as tl

from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "FOLD_MIN_PROGRAMS",
    "NUM_STAGES",
    "NUM_WARPS",
    "PARTIAL_BUDGET",
    "SPLIT",
    "attention",
    "fold_path",
    "n_splits",
    "tokens_per_block",
]

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 2
# KV positions per split: a constant (docs/runtime.md, "Split-KV"), a multiple of BLOCK_N. Tests
# set a smaller one (a multiple of BLOCK_N) to cross split boundaries at short contexts.
SPLIT = 512
# Bytes of fp32 partials one launch may hold; more blocks are launched in groups (a block's
# bits never depend on its group).
PARTIAL_BUDGET = 1 << 29
# The fused fold's launches (fold_path): at least this many (block, KV head) programs, about two
# per SM of an H200, so a launch with fewer keeps the splits' parallelism. Changes no bits.
FOLD_MIN_PROGRAMS = 256
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
def _rows(blocks_ptr, pos_ptr, blk, kvh, G: tl.constexpr, BLOCK_M: tl.constexpr):
    """A program's rows: (token, query head) pairs, their positions, the block's walk end."""
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
    return r, valid, tok, head, pos, hi, crow


@triton.jit
def _walk(
    q,
    k_ptr,
    v_ptr,
    base,
    lo,
    top,
    hi,
    pos,
    qk_scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """One split's partial (m, l, acc): the online-softmax walk of KV tiles [lo, top) from
    (-inf, 0, 0). The one walk both paths run (_split_kernel stores it, _fold_kernel folds it)."""
    d = tl.arange(0, D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for n0 in range(lo, top, BLOCK_N):
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
    return m, l_sum, acc


@triton.jit
def _fold(m, l_sum, acc, mj, lj, aj, inc):
    """Fold split j's partial (mj, lj, aj) into the running (m, l, acc) for the rows `inc` (the
    others keep their state): the one fold step both paths run."""
    m_new = tl.maximum(m, mj)
    alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_new))
    beta = tl.where(m_new == mj, 1.0, tl.exp2(mj - m_new))
    l_sum = tl.where(inc, l_sum * alpha + lj * beta, l_sum)
    acc = tl.where(inc[:, None], acc * alpha[:, None] + aj * beta[:, None], acc)
    m = tl.where(inc, m_new, m)
    return m, l_sum, acc


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
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    b = tl.program_id(0)  # the block within this launch's group
    kvh = tl.program_id(1)
    j = tl.program_id(2)
    r, valid, tok, head, pos, hi, crow = _rows(blocks_ptr, pos_ptr, blk0 + b, kvh, G, BLOCK_M)
    lo = j * SPLIT
    if lo < hi:  # else no row of the block reaches split j: nothing to do
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :])
        base = (crow * KV + kvh) * cap * D
        m, l_sum, acc = _walk(
            q, k_ptr, v_ptr, base, lo, tl.minimum(lo + SPLIT, hi), hi, pos, qk_scale, D, BLOCK_M, BLOCK_N, INTERPRET
        )
        # only the rows that include split j (pos >= lo) keep a partial
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
    # split 0: every row has it (position 0 is always visible); padding rows read finite fillers
    m = tl.load(m_ptr + slot, mask=valid, other=0.0)
    l_sum = tl.load(l_ptr + slot, mask=valid, other=1.0)
    acc = tl.load(acc_ptr + slot.to(tl.int64)[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
    for j in range(1, (hi - 1) // SPLIT + 1):  # the left fold, ascending j
        inc = valid & (pos >= j * SPLIT)  # a row has splits 0 .. pos // SPLIT
        sj = slot + j * BLOCK_M
        mj = tl.load(m_ptr + sj, mask=inc, other=0.0)
        lj = tl.load(l_ptr + sj, mask=inc, other=0.0)
        aj = tl.load(acc_ptr + sj.to(tl.int64)[:, None] * D + d[None, :], mask=inc[:, None], other=0.0)
        m, l_sum, acc = _fold(m, l_sum, acc, mj, lj, aj, inc)
    out = tl.math.div_rn(acc, l_sum[:, None])
    tl.store(
        o_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :],
        bf16_rne_bits(out),
        mask=valid[:, None],
    )


@triton.jit
def _fold_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    blocks_ptr,
    nb,
    cap,
    qk_scale,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    # the last blocks (the longest walks) first; the order changes no row's bits
    blk = nb - 1 - tl.program_id(0)
    kvh = tl.program_id(1)
    r, valid, tok, head, pos, hi, crow = _rows(blocks_ptr, pos_ptr, blk, kvh, G, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (tok[:, None] * H + head[:, None]) * D + d[None, :])
    base = (crow * KV + kvh) * cap * D
    # split 0 (every row has it) is the state, as the combine kernel loads it
    m, l_sum, acc = _walk(
        q, k_ptr, v_ptr, base, 0, tl.minimum(SPLIT, hi), hi, pos, qk_scale, D, BLOCK_M, BLOCK_N, INTERPRET
    )
    for j in range(1, (hi - 1) // SPLIT + 1):  # the combine kernel's left fold, ascending j
        lo = j * SPLIT
        mj, lj, aj = _walk(
            q, k_ptr, v_ptr, base, lo, tl.minimum(lo + SPLIT, hi), hi, pos, qk_scale, D, BLOCK_M, BLOCK_N, INTERPRET
        )
        inc = valid & (pos >= lo)
        # the combine kernel's fillers for rows without split j (selected out by the fold)
        mj = tl.where(inc, mj, 0.0)
        lj = tl.where(inc, lj, 0.0)
        aj = tl.where(inc[:, None], aj, 0.0)
        m, l_sum, acc = _fold(m, l_sum, acc, mj, lj, aj, inc)
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


def n_splits(capacity: int, split: int | None = None) -> int:
    """Splits of a cache of `capacity` positions: ceil(capacity / SPLIT) (the grid's third axis)."""
    s = SPLIT if split is None else split
    return -(-capacity // s)


def fold_path(tokens: int, nblocks: int, kv_heads: int) -> bool:
    """Whether a launch of `tokens` query tokens in `nblocks` blocks takes the fused fold (else
    split + combine): blocks of several tokens on average (prefill, chunked prefill) and at least
    FOLD_MIN_PROGRAMS programs. A function of the launch's shape only; the bits do not depend on it."""
    return tokens > nblocks and nblocks * kv_heads >= FOLD_MIN_PROGRAMS


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    blocks: torch.Tensor,
    scale: float,
    tile: tuple[int, int, int, int] | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """See the module docstring. Returns bf16 [T, H * D]. `path` = "fold" or "split" forces one
    path (tests, benchmarks); None chooses by `fold_path`. `tile` = (BLOCK_M, BLOCK_N, warps,
    stages) overrides the fixed tile for the benchmark's price-of-invariance sweep only (blocks
    must then hold BLOCK_M // G tokens at most; BLOCK_N must divide SPLIT); the runtime never
    passes it."""
    if path not in (None, "fold", "split"):
        raise ValueError(f"path {path!r}: expected 'fold', 'split' or None")
    bm, bn, warps, stages = tile or (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES)
    split = SPLIT
    if split % bn:
        raise ValueError(f"SPLIT {split} is not a multiple of BLOCK_N {bn}")
    index = _launch.device_index(q)
    t, heads, d = q.shape
    kv = k_cache.shape[1]
    out = torch.empty((t, heads * d), dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    g = heads // kv
    tokens_per_block(heads, kv)
    cap = k_cache.shape[2]
    nb = blocks.shape[0]
    qk_scale = float(scale * _LOG2E)
    split_consts = {
        "H": heads,
        "KV": kv,
        "D": d,
        "G": g,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "SPLIT": split,
        "INTERPRET": _launch.INTERPRET,
    }
    cached = index is not None and not _launch.INTERPRET
    opts = {"num_warps": warps, "num_stages": stages}
    if path == "fold" or (path is None and fold_path(t, nb, kv)):
        args = (q, k_cache, v_cache, out.view(torch.int16), pos, blocks, nb, cap, qk_scale)
        key = (
            _launch.launch_key("attention_fold", (warps, stages), index, args, tuple(split_consts.values()))
            if cached
            else None
        )
        _launch.launch(_fold_kernel, (nb, kv, 1), args, split_consts, opts, key, index)
        return out
    ns = n_splits(cap, split)
    group = max(1, min(nb, PARTIAL_BUDGET // (kv * ns * bm * (d + 2) * 4)))
    m_part = torch.empty((group, kv, ns, bm), dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty((group, kv, ns, bm, d), dtype=torch.float32, device=q.device)
    combine_consts = {"H": heads, "KV": kv, "D": d, "G": g, "BLOCK_M": bm, "SPLIT": split}
    for b0 in range(0, nb, group):
        n = min(group, nb - b0)
        args = (q, k_cache, v_cache, m_part, l_part, acc_part, pos, blocks, b0, ns, cap, qk_scale)
        key = (
            _launch.launch_key("attention_split", (warps, stages), index, args, tuple(split_consts.values()))
            if cached
            else None
        )
        _launch.launch(_split_kernel, (n, kv, ns), args, split_consts, opts, key, index)
        args = (m_part, l_part, acc_part, out.view(torch.int16), pos, blocks, b0, ns)
        key = (
            _launch.launch_key("attention_combine", (warps,), index, args, tuple(combine_consts.values()))
            if cached
            else None
        )
        _launch.launch(_combine_kernel, (n, kv, 1), args, combine_consts, {"num_warps": warps}, key, index)
    return out
