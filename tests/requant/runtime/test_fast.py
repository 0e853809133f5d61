"""The fast engine on the CPU: its Triton kernels under TRITON_INTERPRET=1 (set here before
Triton is imported, as tests/kernels/conftest.py does).

References, each independent of the kernel under test:
  * the fused row kernels against their torch emulations (kernels/emulation.py: torch's
    elementwise IEEE operations, requant.kernels.emulation.tree_sum_adjacent and kernels.reference's
    quantize_activations), bit for bit;
  * attention: the kernel against its emulation (emulation.attention_ref, numpy float32),
    bit for bit, with splits of 64 positions and with the production split (one split: the
    unsplit walk); the same query rows computed in one block, in chunks and one token at a
    time (bit for bit), and within a bf16 spacing or two of the reference path's attend_prompt;
  * the model (the micro checkpoint): a token's logits prefilled whole, in chunks of 1, 3, 7
    after a cached prefix and decoded (bit for bit); a prompt alone against its row of a
    batch of mixed lengths (bit for bit); and close to the reference engine's logits; the same
    across a split boundary (SPLIT = 64, 68 tokens: a chunk straddling 64, decode steps at 2
    splits and crossing 64, in a batch and alone).
The same properties on compiled GPU kernels: tests/requant/runtime/test_fast_gpu.py.
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
from requant.kernels.emulation import (
    add_rms_norm_ref,
    attention_ref,
    qk_norm_rope_ref,
    silu_mul_quantize_ref,
)
from requant.kernels.ops import attend_prompt, rope_tables
from requant.kernels.triton.attention import attention, tokens_per_block
from requant.kernels.triton.dense import dense
from requant.kernels.triton.fused import add_rms_norm, qk_norm_rope, silu_mul_quantize

# one KV tile per split: split boundaries at 64, 128, ... within the interpreter's short contexts
SMALL_SPLIT = 64


@pytest.fixture
def small_split(monkeypatch):
    monkeypatch.setattr(attention_module, "SPLIT", SMALL_SPLIT)


def same(a, b) -> bool:
    return a.shape == b.shape and bitwise_equal(a, b)


def _bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def test_add_rms_norm_equals_its_emulation():
    g = torch.Generator().manual_seed(0)
    n = 80  # not a power of two: the tree's zero padding
    x = _bf16(g, 6, n, scale=3.0)
    x[1] = 0  # a zero row: s = 0, q = 0
    x[2] *= 2.0**-100  # tiny rows: the quantizer's 2**64 rescaling
    d = _bf16(g, 6, n)
    d[1] = 0
    d[2] *= 2.0**-100
    w = (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
    xk = x.clone()
    h, q, s = add_rms_norm(xk, w, 1e-6, delta=d, write_h=True)
    xr, hr, qr, sr = add_rms_norm_ref(x, w, 1e-6, delta=d)
    assert same(xk, xr) and same(h, hr) and torch.equal(q, qr) and same(s, sr)
    # no residual, a subset of rows (the last positions of a prefill)
    rows = torch.tensor([5, 0, 3], dtype=torch.int32)
    h2, q2, s2 = add_rms_norm(x.clone(), w, 1e-6, write_h=True, rows=rows)
    _, hr2, qr2, sr2 = add_rms_norm_ref(x[rows.long()], w, 1e-6)
    assert same(h2, hr2) and torch.equal(q2, qr2) and same(s2, sr2)


def test_qk_norm_rope_equals_its_emulation_and_fills_the_cache():
    g = torch.Generator().manual_seed(1)
    heads, kv, dim, t = 6, 2, 16, 7  # 6 query heads: padded to 8 rows in the kernel
    qkv = _bf16(g, t, (heads + 2 * kv) * dim)
    qw, kw = ((torch.rand(dim, generator=g) + 0.5).to(torch.bfloat16) for _ in range(2))
    cos, sin = (c.reshape(64, dim).contiguous() for c in rope_tables(torch.arange(64), dim, 1e6))
    pos = torch.tensor([0, 1, 2, 40, 41, 63, 5], dtype=torch.int32)
    rows = torch.tensor([0, 0, 0, 1, 1, 1, 2], dtype=torch.int32)
    kc = torch.zeros(3, kv, 64, dim, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    q = qk_norm_rope(qkv, qw, kw, cos, sin, pos, rows, kc, vc, heads, kv, 1e-6)
    qr, kr, vr = qk_norm_rope_ref(qkv, qw, kw, cos, sin, pos, heads, kv, 1e-6)
    assert same(q, qr)
    assert same(kc[rows.long(), :, pos.long()], kr) and same(vc[rows.long(), :, pos.long()], vr)
    assert int((kc != 0).any(-1).sum()) == t * kv  # nothing else written


def test_silu_mul_quantize_equals_its_emulation():
    g = torch.Generator().manual_seed(2)
    gu = _bf16(g, 3, 2 * 3000, scale=3.0)  # two slices of SILU_BLOCK_K, the second partial
    q, s = silu_mul_quantize(gu)
    qr, sr = silu_mul_quantize_ref(gu)
    assert torch.equal(q, qr) and same(s, sr)


@pytest.mark.parametrize("split", [None, SMALL_SPLIT], ids=["production-split", "split-64"])
def test_attention_rows_do_not_depend_on_blocks_or_tiles(split, monkeypatch):
    """130 positions (3 KV tiles of 64; with split 64 also 3 splits): whole-sequence blocks,
    chunked blocks (straddling the boundaries) and one-token (decode) blocks give the same
    bits; two sequences in one call equal each alone."""
    if split:
        monkeypatch.setattr(attention_module, "SPLIT", split)
    g = torch.Generator().manual_seed(3)
    heads, kv, dim, t = 4, 2, 16, 130
    per = tokens_per_block(heads, kv)
    q = _bf16(g, t, heads, dim)
    kc = _bf16(g, 2, kv, 256, dim)
    vc = _bf16(g, 2, kv, 256, dim)
    pos = torch.arange(t, dtype=torch.int32)

    def run(blocks, qq=q, pp=pos):
        return attention(qq, kc, vc, pp, torch.tensor(blocks, dtype=torch.int32), dim**-0.5)

    whole = run([(i, min(per, t - i), 0) for i in range(0, t, per)])
    chunks, i = [], 0
    for c in (5, 1, 3, 7, 1, 3, 7, 30, 64, 9):
        chunks += [(i + j, min(per, c - j), 0) for j in range(0, c, per)]
        i += c
    assert i == t and same(run(chunks), whole)
    picked = [0, 1, 62, 63, 64, 65, 127, 128, 129]  # tile edges
    single = run([(i, 1, 0) for i in picked])
    assert same(single[picked], whole[picked])
    # a second sequence (row 1, 20 tokens) packed after the first
    q2 = torch.cat([q, q[:20]])
    pos2 = torch.cat([pos, torch.arange(20, dtype=torch.int32)])
    both = run([(i, min(per, t - i), 0) for i in range(0, t, per)] + [(t, 20, 1)], q2, pos2)
    assert same(both[:t], whole)
    ref = attend_prompt(q[:20], kc[1, :, :20].transpose(0, 1), vc[1, :, :20].transpose(0, 1), dim**-0.5)
    assert (both[t:].float() - ref.float()).abs().max() <= 2 * 2.0**-8 * ref.float().abs().max()
    ref0 = attend_prompt(q, kc[0, :, :t].transpose(0, 1), vc[0, :, :t].transpose(0, 1), dim**-0.5)
    assert (whole.float() - ref0.float()).abs().max() <= 2 * 2.0**-8 * ref0.float().abs().max()


def test_attention_equals_its_emulation_across_splits(monkeypatch):
    """Two sequences (150 positions in cache row 0, in chunks straddling 64 and 128; 70 in row 1)
    against emulation.attention_ref, bit for bit: with SPLIT = 64 (3 and 2 splits), launched in
    groups of one block (PARTIAL_BUDGET = 1), and with the production SPLIT, where one split is
    the unsplit walk (attention_ref with a split longer than the context)."""
    g = torch.Generator().manual_seed(7)
    heads, kv, dim = 4, 2, 16
    per = tokens_per_block(heads, kv)
    q = _bf16(g, 220, heads, dim)
    kc = _bf16(g, 2, kv, 256, dim)
    vc = _bf16(g, 2, kv, 256, dim)
    pos = torch.cat([torch.arange(150), torch.arange(70)]).to(torch.int32)
    blocks, i = [], 0
    for c in (10, 60, 50, 30):  # chunks [0, 10), [10, 70), [70, 120), [120, 150)
        blocks += [(i + j, min(per, c - j), 0) for j in range(0, c, per)]
        i += c
    blocks += [(150 + j, min(per, 70 - j), 1) for j in range(0, 70, per)]
    blocks = torch.tensor(blocks, dtype=torch.int32)
    scale = dim**-0.5
    production = attention_module.SPLIT
    monkeypatch.setattr(attention_module, "SPLIT", SMALL_SPLIT)
    split = attention(q, kc, vc, pos, blocks, scale)
    assert same(split, attention_ref(q, kc, vc, pos, blocks, scale, SMALL_SPLIT))
    monkeypatch.setattr(attention_module, "PARTIAL_BUDGET", 1)
    assert same(attention(q, kc, vc, pos, blocks, scale), split)
    monkeypatch.setattr(attention_module, "SPLIT", production)
    one = attention(q, kc, vc, pos, blocks, scale)
    assert same(one, attention_ref(q, kc, vc, pos, blocks, scale, 10**9))
    first = (pos < SMALL_SPLIT).nonzero().flatten()
    assert same(split[first], one[first])  # a row in split 0 only: the unsplit walk at any SPLIT
    assert not same(split, one)  # rows of 2 splits and more do fold


def test_dense_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(4)
    x = _bf16(g, 70, 96)
    w = _bf16(g, 200, 96, scale=0.1)
    full = dense(x, w)
    assert all(same(dense(x[i : i + 1], w), full[i : i + 1]) for i in (0, 5, 63, 64, 69))
    assert same(dense(x[3:40], w), full[3:40])
    ref = (x.float() @ w.float().T).to(torch.bfloat16).float()  # one rounding; sums in another order
    assert (full - ref).abs().max() <= 2.0**-7 * ref.abs().max()


def test_prefill_chunks_and_decode_give_the_same_logits(micro_fast):
    m = micro_fast
    assert m.engine == "fast"
    seq = torch.randint(0, m.arch.vocab, (15,), generator=torch.Generator().manual_seed(5))
    whole = m.logits([seq])[0]
    cache = m.new_cache(1, 32)
    parts = [m.extend([seq[:2]], cache)]
    i = 2
    for c in (1, 3, 7):
        parts.append(m.extend([seq[i : i + c]], cache))
        i += c
    while i < len(seq):
        parts.append(m.decode_step(seq[i : i + 1], cache))
        i += 1
    assert cache.lengths == [15]
    assert same(torch.cat(parts), whole)


@pytest.fixture(scope="module")
def split_seq(micro_fast):
    """68 ids (2 splits of 64) and their logits prefilled whole, with SPLIT = 64."""
    seq = torch.randint(0, micro_fast.arch.vocab, (68,), generator=torch.Generator().manual_seed(8))
    production = attention_module.SPLIT
    attention_module.SPLIT = SMALL_SPLIT
    try:
        whole = micro_fast.logits([seq])[0]
    finally:
        attention_module.SPLIT = production
    return seq, whole


def test_prefill_chunks_and_decode_across_split_boundaries(micro_fast, split_seq, small_split):
    """SPLIT = 64, 68 tokens: prefilled whole against a chunk [0, 58), a chunk [58, 66) that
    straddles 64, and decode steps at 66 and 67 (2 splits): the same logits, bit for bit."""
    m = micro_fast
    seq, whole = split_seq
    cache = m.new_cache(1, 128)
    parts = [m.extend([seq[:58]], cache), m.extend([seq[58:66]], cache)]
    parts += [m.decode_step(seq[i : i + 1], cache) for i in (66, 67)]
    assert cache.lengths == [68]
    assert same(torch.cat(parts), whole)


def test_alone_equals_in_the_batch_across_split_boundaries(micro_fast, split_seq, small_split):
    """SPLIT = 64: a 62-token prompt prefilled in a batch with a 5-token one, then decoded in
    that batch at positions 62 .. 67 (crossing 64): row 0 against the prompt prefilled whole
    and alone, bit for bit."""
    m = micro_fast
    seq, whole = split_seq
    other = torch.randint(0, m.arch.vocab, (11,), generator=torch.Generator().manual_seed(9))
    cache = m.new_cache(2, 128)
    first = m.extend([seq[:62], other[:5]], cache)
    assert same(first[:62], whole[:62])
    for i in range(62, 68):
        step = m.decode_step(torch.stack([seq[i], other[i - 57]]), cache)
        assert same(step[0], whole[i]), i


def test_alone_equals_in_the_batch_and_is_close_to_the_reference(micro_fast):
    m = micro_fast
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, m.arch.vocab, (n,), generator=g) for n in (7, 1, 3)]
    batch = m.logits(prompts)
    assert all(same(m.logits([p])[0], batch[i]) for i, p in enumerate(prompts))
    gen = m.generate(prompts, 3, keep_logits=True)
    alone = m.generate([prompts[0]], 3, keep_logits=True)
    assert alone.ids[0] == gen.ids[0] and all(same(alone.step_logits[s][0], gen.step_logits[s][0]) for s in range(3))
    ref = m.with_backends(engine="reference").logits(prompts)
    o, r = torch.cat(batch), torch.cat(ref)
    assert float((o - r).pow(2).mean().sqrt() / r.std()) <= 0.05
    assert float((o.argmax(-1) == r.argmax(-1)).float().mean()) >= 0.9


def test_engine_choice_and_refusals(micro_fast, tmp_path):
    m = micro_fast
    with pytest.raises(ValueError, match="engine must be one of"):
        m.with_backends(engine="turbo")
    ref = m.with_backends(engine="reference")
    assert ref.engine == "reference"
    with pytest.raises(ValueError, match="extend needs the fast engine"):
        ref.extend([[1, 2]], ref.new_cache(1, 8))
    cache = m.new_cache(1, 8)
    with pytest.raises(ValueError, match="KV cache full"):
        m.extend([list(range(9))], cache)
    big = m.new_cache(1, 2 * m.max_length)
    with pytest.raises(ValueError, match="beyond max_length"):
        m.extend([[1] * (m.max_length + 1)], big)


def test_capture_records_what_the_fast_gemms_consumed(micro_fast, monkeypatch):
    """The fast engine's capture (prefill and decode_step): the reference engine's names and
    operand shapes, and each recorded (q, s) is the very pair its kernels.scaled_mm call
    received (a spy around kernels.scaled_mm); one call per group (stacked weights). The
    values may differ from the reference engine's (its hidden states are computed otherwise)."""
    from requant import kernels

    class Rec:
        def __init__(self):
            self.records = []

        def record(self, names, q, s):
            self.records.append((names, q, s))

    seen = []
    real = kernels.scaled_mm

    def spy(a, w, s_a, s_w, *args, **kw):
        seen.append((a, s_a))
        return real(a, w, s_a, s_w, *args, **kw)

    m = micro_fast
    ref = m.with_backends(engine="reference")
    prompts = [torch.tensor([3, 4, 5, 6]), torch.tensor([7])]
    fast_rec, ref_rec = Rec(), Rec()
    with torch.no_grad():
        want = m.prefill(prompts)
        monkeypatch.setattr(kernels, "scaled_mm", spy)
        got = m.prefill(prompts, capture=fast_rec)
        monkeypatch.setattr(kernels, "scaled_mm", real)
        ref.prefill(prompts, capture=ref_rec)
    assert same(got, want)  # capture changes nothing
    assert [r[0] for r in fast_rec.records] == [r[0] for r in ref_rec.records]
    for (_, q, s), (_, rq, rs) in zip(fast_rec.records, ref_rec.records):
        assert q.shape == rq.shape and q.dtype == rq.dtype and s.shape == rs.shape and s.dtype == rs.dtype
    assert len(seen) == len(fast_rec.records) and all(
        a is q and s_a is s for (a, s_a), (_, q, s) in zip(seen, fast_rec.records)
    )
    # decode_step: M = the batch
    cache = m.new_cache(2, 8)
    rec = Rec()
    with torch.no_grad():
        m.prefill(prompts, cache=cache)
        m.decode_step(torch.tensor([9, 10]), cache, capture=rec)
    assert [r[0] for r in rec.records] == [r[0] for r in ref_rec.records]
    assert all(q.shape[0] == 2 and s.shape == (2, 1) for _, q, s in rec.records)


def test_choose_on_the_fast_engine(micro_fast):
    """choose replaces the argmax, once per step on every row, as on the reference engine."""
    m = micro_fast
    prompts = [[3, 4, 5], [7, 8]]
    steps = []

    def second_best(step, logits):
        steps.append(step)
        return torch.topk(logits, 2, dim=-1).indices[:, 1]

    g = m.generate(prompts, 3, keep_logits=True, choose=second_best)
    assert steps == [0, 1, 2]
    for s, lg in enumerate(g.step_logits):
        assert [row[s] for row in g.ids] == torch.topk(lg, 2, dim=-1).indices[:, 1].tolist()
    plain = m.generate(prompts, 3, keep_logits=True)
    assert plain.ids == m.generate(prompts, 3, choose=lambda s, lg: lg.argmax(-1)).ids
