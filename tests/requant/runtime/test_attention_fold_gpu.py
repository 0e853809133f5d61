"""GPU tests of the attention's fused fold (marker `gpu`; skipped without CUDA), compiled kernels.

References, each independent of the fused-fold kernel:
  * the split + combine kernels (the path every earlier record was computed with) on the same
    inputs, bit for bit, at 1,100 and 8,192 tokens (Qwen3-8B's attention shape: 32 query heads,
    8 KV heads, 128 dims), prefilled whole and in chunks straddling split boundaries, at the
    production SPLIT and at 64, and the same rows as one-token (decode) blocks;
  * a CUDA graph of the fused fold captured at one set of positions and replayed at others
    (new contents of pos and blocks, the same shapes) against eager launches, bit for bit;
  * the model (embedded default, 1,100 tokens, every multi-token launch folding): logits against
    the same prompt with every launch on split + combine, prefilled whole, in chunks and decoded.
Run: python3 -m pytest -q -m gpu tests/requant/runtime/test_attention_fold_gpu.py
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import requant.kernels.triton.attention as attention_module
from requant import DEFAULT_CHECKPOINT
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.triton.attention import attention, tokens_per_block
from requant.models.prompts import prompts
from requant.runtime import load_model

pytestmark = pytest.mark.gpu


def same(a, b) -> bool:
    return a.shape == b.shape and bitwise_equal(a, b)


def _blocks(chunks, per):
    blocks, i = [], 0
    for c in chunks:
        blocks += [(i + j, min(per, c - j), 0) for j in range(0, c, per)]
        i += c
    return torch.tensor(blocks, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("split", [None, 64], ids=["production-split", "split-64"])
@pytest.mark.parametrize("n", [1100, 8192])
def test_fold_equals_split_combine(n, split, monkeypatch):
    if split:
        monkeypatch.setattr(attention_module, "SPLIT", split)
    g = torch.Generator("cuda").manual_seed(n)
    heads, kv, dim = 32, 8, 128
    per = tokens_per_block(heads, kv)
    cap = 1 << (n - 1).bit_length()

    def bf(*shape):
        return torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)

    q, kc, vc = bf(n, heads, dim), bf(1, kv, cap, dim), bf(1, kv, cap, dim)
    pos = torch.arange(n, dtype=torch.int32, device="cuda")
    scale = dim**-0.5
    whole = _blocks([n], per)
    fold = attention(q, kc, vc, pos, whole, scale, path="fold")
    assert same(fold, attention(q, kc, vc, pos, whole, scale, path="split"))
    # chunks straddling 512, 1024 (and many 64-boundaries): blocks start unaligned
    chunks = [500, 30, 490, 11, n - 1031]
    assert sum(chunks) == n
    chunked = _blocks(chunks, per)
    got = attention(q, kc, vc, pos, chunked, scale, path="fold")
    assert same(got, fold), (got != fold).any(-1).nonzero().flatten()[:10].tolist()
    assert same(got, attention(q, kc, vc, pos, chunked, scale, path="split"))
    picked = [0, 63, 64, 511, 512, 513, 1023, 1024, 1099, n - 1]
    single = torch.tensor([(i, 1, 0) for i in picked], dtype=torch.int32, device="cuda")
    one = attention(q, kc, vc, pos, single, scale, path="fold")[picked]
    assert same(one, fold[picked])
    assert same(one, attention(q, kc, vc, pos, single, scale, path="split")[picked])


def test_fold_graph_replays_at_other_positions():
    """The fold's bounds come from device memory: a graph captured for 64 tokens at positions
    0 .. 63 replays them at 1000 .. 1063 and 1500 .. 1563 (other splits) like eager launches."""
    g = torch.Generator("cuda").manual_seed(5)
    heads, kv, dim, cap = 32, 8, 128, 2048
    per = tokens_per_block(heads, kv)

    def bf(*shape):
        return torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)

    q, kc, vc = bf(64, heads, dim), bf(1, kv, cap, dim), bf(1, kv, cap, dim)
    pos = torch.arange(64, dtype=torch.int32, device="cuda")
    blocks = _blocks([64], per)
    out = attention(q, kc, vc, pos, blocks, dim**-0.5, path="fold")  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, kc, vc, pos, blocks, dim**-0.5, path="fold")
    for start in (1000, 1500):
        pos.copy_(torch.arange(start, start + 64, dtype=torch.int32, device="cuda"))
        graph.replay()
        want = attention(q, kc, vc, pos, blocks, dim**-0.5, path="fold")
        assert same(out, want) and same(out, attention(q, kc, vc, pos, blocks, dim**-0.5, path="split"))


@pytest.fixture(scope="module")
def model():
    return load_model(DEFAULT_CHECKPOINT, regime="pow2", backend="triton", act_backend="triton", device="cuda")


def test_model_fold_equals_split_prefill_chunks_and_decode(model, monkeypatch):
    """1,100 tokens: logits with every launch on split + combine against prefill with every
    multi-token launch folding (FOLD_MIN_PROGRAMS = 1), chunks [0, 500), [500, 530), [530, 1020)
    and decode steps 1020 .. 1030 and a chunk [1031, 1100), bit for bit."""
    toks = [model.tokenizer.encode(p) for p in prompts(8)]
    seq = torch.tensor([t for p in toks for t in p] * 16)[:1100]
    assert len(seq) == 1100
    model.impl.layout.decoders.clear()
    monkeypatch.setattr(attention_module, "FOLD_MIN_PROGRAMS", 1 << 30)
    split_only = model.logits([seq])[0]
    monkeypatch.setattr(attention_module, "FOLD_MIN_PROGRAMS", 1)
    whole = model.logits([seq])[0]
    assert same(whole, split_only)
    cache = model.new_cache(1, 2048)
    parts = [model.extend([seq[a:b]], cache) for a, b in ((0, 500), (500, 530), (530, 1020))]
    parts += [model.decode_step(seq[i : i + 1], cache) for i in range(1020, 1031)]
    parts.append(model.extend([seq[1031:]], cache))
    got = torch.cat(parts)
    assert same(got, split_only), (got != split_only).any(-1).nonzero().flatten().tolist()
