"""One causal attention for prefill, chunked prefill and decode (the fast path's), split-KV.

    attention(q, k_cache, v_cache, pos, blocks) -> bf16 [T, H * D]

q bf16 [T, H, D] (after norms and RoPE); k_cache, v_cache bf16 [rows, KV, capacity, D] holding
every key and value up to each token's position, this call's included; pos int32 [T] absolute
positions; blocks int32 [NB, 3] = (first token, count <= BLOCK_M // G, cache row): consecutive
tokens of one sequence. A block's BLOCK_M rows are (token, query head) pairs: the G = H / KV heads
of one KV head for BLOCK_M / G tokens (GQA packing); rows beyond its tokens are padding.

Split + combine (_split_kernel, _combine_kernel: splits at absolute positions [j * SPLIT,
(j + 1) * SPLIT), each walked with the flash online softmax in fp32, then folded in ascending
order), or the fused fold (_fold_kernel: the same walk _walk and fold step _fold, without the
partials' round trip) for long launches (fold_path); the same bits on both paths. The split and
combine kernels also compute the portable arithmetic (PORTABLE: lane dots, adjacent trees,
software exp2; kernels/triton/portable.py), resolved at compile time. The arithmetic, the fold
and why the bits depend on neither batch, chunking nor path:
docs/runtime.md#split-kv-attention-the-fast-engine. The torch emulation: kernels/emulation.py attention_ref.
"""

import torch
import triton
import triton.language as tl

from requant.kernels import portable as spec
from requant.kernels.triton import _launch
from requant.kernels.triton._bf16 import bf16_rne_bits
from requant.kernels.triton._portable_math import OPTIONS, exp2_p
from requant.kernels.triton.fused import bits_to_fp32, tree_sum_rows

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
# The fused fold's launches (fold_path): at least this many (block, KV head) programs, so a launch
# with fewer keeps the splits' parallelism. Changes no bits. Chosen by measurement (was a guess of
# 256): one H100, 8B shape, `bench_long_context --parts fold` (benchmarks/results/speed4_gpu/3481826/):
# at 128 programs the fold beats split + combine 2.23x at position 0 and 1.16x at 4096; at 64
# programs it loses at 4096 (0.65x).
FOLD_MIN_PROGRAMS = 128
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
def _walk_lanes(
    q_ptr,
    k_ptr,
    v_ptr,
    tok,
    head,
    crow,
    kvh,
    cap,
    lo,
    top,
    hi,
    pos,
    qk_scale,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    LANES: tl.constexpr,
):
    """_walk in the portable arithmetic (docs/runtime.md, "The portable arithmetic"): q and the
    caches read as bf16 bits, lane dots and adjacent trees instead of MMAs and tl.sum, exp2_p."""
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
        s = tl.reshape(tree_sum_rows(tl.reshape(s3, (BLOCK_M * TILE, LANES)), BLOCK_M * TILE, LANES), (BLOCK_M, TILE))
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
    return m, l_sum, acc


@triton.jit
def _exp2(x, PORTABLE: tl.constexpr):
    # resolved at compile time: the device's exp2, or the portable arithmetic's
    if PORTABLE:
        return exp2_p(x)
    return tl.exp2(x)


@triton.jit
def _fold(m, l_sum, acc, mj, lj, aj, inc, PORTABLE: tl.constexpr):
    """Fold split j's partial (mj, lj, aj) into the running (m, l, acc) for the rows `inc` (the
    others keep their state): the one fold step every path runs."""
    m_new = tl.maximum(m, mj)
    alpha = tl.where(m_new == m, 1.0, _exp2(m - m_new, PORTABLE))
    beta = tl.where(m_new == mj, 1.0, _exp2(mj - m_new, PORTABLE))
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
    LANES: tl.constexpr,
    PORTABLE: tl.constexpr,
):
    b = tl.program_id(0)  # the block within this launch's group
    kvh = tl.program_id(1)
    j = tl.program_id(2)
    r, valid, tok, head, pos, hi, crow = _rows(blocks_ptr, pos_ptr, blk0 + b, kvh, G, BLOCK_M)
    lo = j * SPLIT
    if lo < hi:  # else no row of the block reaches split j: nothing to do
        if PORTABLE:  # q, k, v as bf16 bits (int16)
            top = tl.minimum(lo + SPLIT, hi)
            m, l_sum, acc = _walk_lanes(
                q_ptr,
                k_ptr,
                v_ptr,
                tok,
                head,
                crow,
                kvh,
                cap,
                lo,
                top,
                hi,
                pos,
                qk_scale,
                H,
                KV,
                D,
                BLOCK_M,
                BLOCK_N,
                LANES,
            )
            d = tl.arange(0, D)
        else:
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
    PORTABLE: tl.constexpr,
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
        m, l_sum, acc = _fold(m, l_sum, acc, mj, lj, aj, inc, PORTABLE)
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
        m, l_sum, acc = _fold(m, l_sum, acc, mj, lj, aj, inc, False)
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
    tokens_per_block(heads, kv)
    nb = blocks.shape[0]
    qk_scale = float(scale * _LOG2E)
    if path == "fold" or (path is None and fold_path(t, nb, kv)):
        consts = {
            "H": heads,
            "KV": kv,
            "D": d,
            "G": heads // kv,
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "SPLIT": split,
            "INTERPRET": _launch.INTERPRET,
        }
        args = (q, k_cache, v_cache, out.view(torch.int16), pos, blocks, nb, k_cache.shape[2], qk_scale)
        key = (
            _launch.launch_key("attention_fold", (warps, stages), index, args, tuple(consts.values()))
            if index is not None and not _launch.INTERPRET
            else None
        )
        _launch.launch(_fold_kernel, (nb, kv, 1), args, consts, {"num_warps": warps, "num_stages": stages}, key, index)
        return out
    _split_combine(q, k_cache, v_cache, pos, blocks, out, qk_scale, bm, bn, split, warps, stages, index, False)
    return out


def _split_combine(q, k_cache, v_cache, pos, blocks, out, qk_scale, bm, bn, split, warps, stages, index, portable):
    """The split + combine launches over groups of blocks (PARTIAL_BUDGET bytes of partials each)
    into `out` (bf16 [T, H * D]). portable: the portable arithmetic (BLOCK_N is its TILE; q and the
    caches passed as bf16 bits; compiled with _portable_math.OPTIONS; its own launch keys)."""
    t, heads, d = q.shape
    kv = k_cache.shape[1]
    g = heads // kv
    cap = k_cache.shape[2]
    nb = blocks.shape[0]
    ns = n_splits(cap, split)
    group = max(1, min(nb, PARTIAL_BUDGET // (kv * ns * bm * (d + 2) * 4)))
    m_part = torch.empty((group, kv, ns, bm), dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty((group, kv, ns, bm, d), dtype=torch.float32, device=q.device)
    split_consts = {
        "H": heads,
        "KV": kv,
        "D": d,
        "G": g,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "SPLIT": split,
        "INTERPRET": _launch.INTERPRET,
        "LANES": spec.LANES,
        "PORTABLE": portable,
    }
    combine_consts = {"H": heads, "KV": kv, "D": d, "G": g, "BLOCK_M": bm, "SPLIT": split, "PORTABLE": portable}
    if portable:
        q, k_cache, v_cache = q.view(torch.int16), k_cache.view(torch.int16), v_cache.view(torch.int16)
        names, cfgs = ("p_attention_split", "p_attention_combine"), (("portable", warps), ("portable", warps))
        split_opts = combine_opts = dict(OPTIONS, num_warps=warps)
    else:
        names, cfgs = ("attention_split", "attention_combine"), ((warps, stages), (warps,))
        split_opts, combine_opts = {"num_warps": warps, "num_stages": stages}, {"num_warps": warps}
    cached = index is not None and not _launch.INTERPRET
    for b0 in range(0, nb, group):
        n = min(group, nb - b0)
        args = (q, k_cache, v_cache, m_part, l_part, acc_part, pos, blocks, b0, ns, cap, qk_scale)
        key = _launch.launch_key(names[0], cfgs[0], index, args, tuple(split_consts.values())) if cached else None
        _launch.launch(_split_kernel, (n, kv, ns), args, split_consts, split_opts, key, index)
        args = (m_part, l_part, acc_part, out.view(torch.int16), pos, blocks, b0, ns)
        key = _launch.launch_key(names[1], cfgs[1], index, args, tuple(combine_consts.values())) if cached else None
        _launch.launch(_combine_kernel, (n, kv, 1), args, combine_consts, combine_opts, key, index)
