"""The attention's fused fold (one program per block and KV head walking all its splits) on the
CPU, under TRITON_INTERPRET=1 (set here before Triton is imported, as test_fast.py does).

References, each independent of the fused-fold kernel:
  * the split + combine kernels (the path every earlier record was computed with), bit for bit;
  * emulation.attention_ref (numpy float32, the interpreter's operations on the kernel's tile
    shapes: each split's walk, then the left fold of its partials), bit for bit;
  * the model (the micro checkpoint, SPLIT = 64): logits with every launch forced onto split +
    combine, against prefill (fused fold), chunked prefill and decode (split + combine) with the
    shape-chosen dispatch, alone and in a batch, bit for bit.
The same on compiled GPU kernels: test_attention_fold_gpu.py.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # on a GPU machine, Triton compiles (and these tests skip)
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch

if not _launch.INTERPRET:
    pytest.skip(
        "Triton was imported without TRITON_INTERPRET=1 (the GPU tests cover the kernels)",
        allow_module_level=True,
    )

import requant.kernels.triton.attention as attention_module
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.emulation import attention_ref
from requant.kernels.triton.attention import attention, fold_path, tokens_per_block

SMALL_SPLIT = 64


def same(a, b) -> bool:
    return a.shape == b.shape and bitwise_equal(a, b)


def _bf16(g, *shape):
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _chunked_blocks(chunks, per, row, first_token=0):
    """Blocks of `per` tokens at most over consecutive chunks of one sequence (cache `row`)."""
    blocks, i = [], first_token
    for c in chunks:
        blocks += [(i + j, min(per, c - j), row) for j in range(0, c, per)]
        i += c
    return blocks


@pytest.mark.parametrize(
    "tile",
    [None, (64, 16, 4, 2)],
    ids=["production-tile", "block_n-16"],
)
def test_fold_equals_split_combine_and_emulation(tile, monkeypatch):
    """SPLIT = 64, GQA (8 query heads on 2 KV heads: 16 tokens a block). Sequence 0 (cache row 0,
    200 positions: 4 splits, the last ending mid-split) in chunks [0, 10), [10, 63), [63, 65),
    [65, 128), [128, 129), [129, 200): blocks straddling 64 and 128, rows at 63, 64, 127 and 128
    (split ends and starts), padding rows; with BLOCK_N = 16 the chunks' unaligned blocks walk
    tiles fully masked for their first rows. Sequence 1 (row 1, 70 positions) in blocks of its
    own; then the same rows as one-token (decode) blocks. The fused fold against split + combine
    and against attention_ref, bit for bit."""
    monkeypatch.setattr(attention_module, "SPLIT", SMALL_SPLIT)
    g = torch.Generator().manual_seed(11)
    heads, kv, dim = 8, 2, 16
    per = tokens_per_block(heads, kv)
    assert per == 16
    q = _bf16(g, 270, heads, dim)
    kc = _bf16(g, 2, kv, 256, dim)
    vc = _bf16(g, 2, kv, 256, dim)
    pos = torch.cat([torch.arange(200), torch.arange(70)]).to(torch.int32)
    blocks = _chunked_blocks((10, 53, 2, 63, 1, 71), per, 0) + _chunked_blocks((70,), per, 1, 200)
    blocks = torch.tensor(blocks, dtype=torch.int32)
    assert {63, 64, 127, 128} <= set(int(pos[b[0] + b[1] - 1]) for b in blocks.tolist())  # rows ending at edges
    bm, bn = (tile or (64, 64))[:2]
    scale = dim**-0.5
    ref = attention_ref(q, kc, vc, pos, blocks, scale, SMALL_SPLIT, block_m=bm, block_n=bn)
    fold = attention(q, kc, vc, pos, blocks, scale, tile=tile, path="fold")
    split = attention(q, kc, vc, pos, blocks, scale, tile=tile, path="split")
    assert same(fold, ref)
    assert same(fold, split)
    picked = [0, 9, 62, 63, 64, 65, 127, 128, 129, 199, 200, 263, 264, 269]  # split edges, both sequences
    single = torch.tensor([(i, 1, 0 if i < 200 else 1) for i in picked], dtype=torch.int32)
    fold1 = attention(q, kc, vc, pos, single, scale, tile=tile, path="fold")
    fold1 = fold1[picked]
    assert same(fold1, attention_ref(q, kc, vc, pos, single, scale, SMALL_SPLIT, block_m=bm, block_n=bn)[picked])
    assert same(fold1, attention(q, kc, vc, pos, single, scale, tile=tile, path="split")[picked])
    assert same(fold1, fold[picked])  # decode-shaped blocks: a row depends on its position only
    # rows of several splits do fold: not the one-split walk of the production SPLIT
    monkeypatch.setattr(attention_module, "SPLIT", 512)
    assert not same(attention(q, kc, vc, pos, blocks, scale, tile=tile, path="fold"), fold)


def test_fold_at_the_production_split_is_the_unsplit_walk():
    """Contexts inside one split (SPLIT = 512): the fused fold equals attention_ref with a split
    longer than the context (the walk without splits) and split + combine, bit for bit."""
    g = torch.Generator().manual_seed(12)
    heads, kv, dim = 4, 2, 16
    per = tokens_per_block(heads, kv)
    q = _bf16(g, 150, heads, dim)
    kc = _bf16(g, 1, kv, 256, dim)
    vc = _bf16(g, 1, kv, 256, dim)
    pos = torch.arange(150, dtype=torch.int32)
    blocks = torch.tensor(_chunked_blocks((7, 100, 43), per, 0), dtype=torch.int32)
    fold = attention(q, kc, vc, pos, blocks, dim**-0.5, path="fold")
    assert same(fold, attention_ref(q, kc, vc, pos, blocks, dim**-0.5, 10**9))
    assert same(fold, attention(q, kc, vc, pos, blocks, dim**-0.5, path="split"))


def test_dispatch_depends_on_the_launch_shape(monkeypatch):
    """fold_path: multi-token blocks with enough programs fold; decode (one token a block) and
    small launches split. A bad path is refused."""
    monkeypatch.setattr(attention_module, "FOLD_MIN_PROGRAMS", 256)
    assert fold_path(8192, 512, 8)  # 1 x 8192 prefill at the 8B shape: 4096 programs
    assert not fold_path(64, 64, 8)  # decode, batch 64
    assert not fold_path(1, 1, 8)  # decode, batch 1
    assert not fold_path(64, 4, 8)  # a short chunk: 32 programs keep the splits' parallelism
    q = torch.zeros(1, 4, 16, dtype=torch.bfloat16)
    kc = torch.zeros(1, 2, 64, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="path 'both'"):
        attention(q, kc, kc, torch.zeros(1, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.int32), 1.0, path="both")


@pytest.fixture
def split_only(micro_fast):
    """68 ids and their logits prefilled whole with SPLIT = 64 and every launch on split + combine
    (FOLD_MIN_PROGRAMS above any launch of the micro model)."""
    seq = torch.randint(0, micro_fast.arch.vocab, (68,), generator=torch.Generator().manual_seed(8))
    saved = attention_module.SPLIT, attention_module.FOLD_MIN_PROGRAMS
    attention_module.SPLIT, attention_module.FOLD_MIN_PROGRAMS = SMALL_SPLIT, 1 << 30
    try:
        whole = micro_fast.logits([seq])[0]
    finally:
        attention_module.SPLIT, attention_module.FOLD_MIN_PROGRAMS = saved
    return seq, whole


def test_model_fold_prefill_equals_split_chunks_and_decode(micro_fast, split_only, monkeypatch):
    """SPLIT = 64, FOLD_MIN_PROGRAMS = 1 (every multi-token launch folds): the 68 tokens prefilled
    whole, in chunks [0, 58) and [58, 66) (straddling 64), decoded at 66 and 67 (split + combine),
    and in a batch with an 11-token prompt: the split-only logits, bit for bit."""
    m = micro_fast
    seq, whole = split_only
    monkeypatch.setattr(attention_module, "SPLIT", SMALL_SPLIT)
    monkeypatch.setattr(attention_module, "FOLD_MIN_PROGRAMS", 1)
    a = m.arch
    assert fold_path(68, -(-68 // tokens_per_block(a.heads, a.kv_heads)), a.kv_heads)
    assert not fold_path(1, 1, a.kv_heads)
    assert same(m.logits([seq])[0], whole)
    cache = m.new_cache(1, 128)
    parts = [m.extend([seq[:58]], cache), m.extend([seq[58:66]], cache)]
    parts += [m.decode_step(seq[i : i + 1], cache) for i in (66, 67)]
    assert same(torch.cat(parts), whole)
    other = torch.randint(0, a.vocab, (11,), generator=torch.Generator().manual_seed(9))
    assert same(m.logits([seq, other])[0], whole)
