"""GPU tests of the runtime's fast engine (marker `gpu`; skipped without CUDA), on the
embedded default, with the real compiled kernels.

References, each independent of the code under test:
  * the fused row kernels against their torch emulations (kernels/emulation.py) run
    on the CPU, bit for bit;
  * prefill/decode invariance: the same token's logits prefilled with the whole prompt (the
    reference, Model.logits), in chunks of 1, 3 and 7 after a cached prefix, and decoded one token
    at a time;
  * batch invariance: each prompt alone against its row of a batch of mixed lengths (the reference);
  * graph vs eager: generate(graphs=True) against the same kernels launched one by one (the reference);
  (the chunked and decoded paths and the bitwise comparison: requant.runtime.invariance, whose
  procedure tests/requant/runtime/test_invariance.py checks on the CPU)
  * kernel invariance: cutlass against triton under pow2 (8 prompts, 64 tokens);
  * the same across split-KV boundaries, at the production SPLIT (1100 tokens: 3 splits) and
    at SPLIT = 64: chunks straddling a boundary, decode steps crossing one, alone against a
    batch, graph against eager;
  * parity: transformers' fp32 Qwen3 on the same weights with the same thresholds as
    tests/requant/runtime/test_parity.py.
Run: python3 -m pytest -q -m gpu tests/requant/runtime/test_fast_gpu.py
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from requant import DEFAULT_CHECKPOINT
from requant.kernels.bf16 import bitwise_equal
from requant.models.prompts import prompts
from requant.runtime import invariance, load_model

pytestmark = pytest.mark.gpu
SM90 = torch.cuda.get_device_capability() == (9, 0)
BACKENDS = [
    "triton",
    pytest.param("cutlass", marks=pytest.mark.skipif(not SM90, reason="CUTLASS is sm90a only")),
]


@pytest.fixture(params=[None, 64], ids=["production-split", "split-64"])
def split(request, model, monkeypatch):
    """The attention's SPLIT for one test; captured decode graphs (which hold it) are dropped
    before and after."""
    import requant.kernels.triton.attention as attention_module

    model.impl.layout.decoders.clear()
    if request.param:
        monkeypatch.setattr(attention_module, "SPLIT", request.param)
    yield attention_module.SPLIT
    model.impl.layout.decoders.clear()


def same(a, b) -> bool:
    return a.shape == b.shape and bitwise_equal(a, b)


@pytest.fixture(scope="module")
def model():
    m = load_model(
        DEFAULT_CHECKPOINT,
        regime="pow2",
        backend="triton",
        act_backend="triton",
        device="cuda",
    )
    assert m.engine == "fast"  # the CUDA default for a W8A8 checkpoint
    return m


@pytest.fixture(scope="module")
def toks(model):
    return [model.tokenizer.encode(p) for p in prompts(8)]


def test_fused_kernels_equal_their_cpu_emulation():
    from requant.kernels.emulation import add_rms_norm_ref, qk_norm_rope_ref
    from requant.kernels.ops import rope_tables
    from requant.kernels.triton.fused import add_rms_norm, qk_norm_rope

    g = torch.Generator().manual_seed(0)
    for t, n in ((1, 4096), (37, 2048), (300, 5120)):
        x = (torch.randn(t, n, generator=g) * 4).to(torch.bfloat16)
        d = torch.randn(t, n, generator=g).to(torch.bfloat16)
        w = (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
        xc = x.cuda()
        h, q, s = add_rms_norm(xc, w.cuda(), 1e-6, delta=d.cuda(), write_h=True)
        xr, hr, qr, sr = add_rms_norm_ref(x, w, 1e-6, delta=d)
        assert same(xc.cpu(), xr) and same(h.cpu(), hr) and torch.equal(q.cpu(), qr) and same(s.cpu(), sr), (t, n)
    heads, kv, dim, t = 32, 8, 128, 50
    qkv = torch.randn(t, (heads + 2 * kv) * dim, generator=g).to(torch.bfloat16)
    qw, kw = ((torch.rand(dim, generator=g) + 0.5).to(torch.bfloat16) for _ in range(2))
    cos, sin = (c.reshape(4096, dim).contiguous() for c in rope_tables(torch.arange(4096), dim, 1e6))
    pos = torch.randint(0, 4096, (t,), generator=g, dtype=torch.int32)
    rows = torch.arange(t, dtype=torch.int32)
    kc = torch.zeros(t, kv, 4096, dim, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    qo = qk_norm_rope(
        qkv.cuda(),
        qw.cuda(),
        kw.cuda(),
        cos.cuda(),
        sin.cuda(),
        pos.cuda(),
        rows.cuda(),
        kc,
        vc,
        heads,
        kv,
        1e-6,
    )
    qr, kr, vr = qk_norm_rope_ref(qkv, qw, kw, cos, sin, pos, heads, kv, 1e-6)
    assert same(qo.cpu(), qr)
    assert same(kc[rows.long().cuda(), :, pos.long().cuda()].cpu(), kr) and same(
        vc[rows.long().cuda(), :, pos.long().cuda()].cpu(), vr
    )


def test_dense_and_silu_rows_do_not_depend_on_the_batch():
    from requant.kernels.triton.dense import dense
    from requant.kernels.triton.fused import silu_mul_quantize

    g = torch.Generator().manual_seed(1)
    x = torch.randn(130, 1024, generator=g).to(torch.bfloat16).cuda()
    w = torch.randn(3000, 1024, generator=g).to(torch.bfloat16).cuda()
    full = dense(x, w)
    assert all(same(dense(x[i : i + 1], w), full[i : i + 1]) for i in (0, 63, 64, 129))
    assert same(dense(x[60:70], w), full[60:70])
    gu = torch.randn(130, 2 * 3072, generator=g).to(torch.bfloat16).cuda()
    q, s = silu_mul_quantize(gu)
    q1, s1 = silu_mul_quantize(gu[77:78].contiguous())
    assert torch.equal(q1, q[77:78]) and same(s1, s[77:78])


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_chunks_and_decode_give_the_same_logits(model, toks, backend):
    m = model.with_backends(backend)
    seq = torch.tensor([t for p in toks for t in p] * 2)[:300]  # 2 x 174 tokens
    whole = m.logits([seq])[0]
    got = invariance.piecewise_logits(m, seq, invariance.pieces(300, 40, (1, 3, 7) * 5), 512)
    verdict = invariance.compare_positions("prefill == chunks == decode", got, whole)
    assert verdict.ok and verdict.compared == 300, verdict
    assert same(got, whole)


@pytest.mark.parametrize("backend", BACKENDS)
def test_alone_equals_in_the_batch(model, toks, backend):
    m = model.with_backends(backend)
    batch = m.logits(toks)
    verdict = invariance.compare_items("alone == batch (prefill)", invariance.alone_rows(m, toks), batch)
    assert verdict.ok and verdict.compared == len(toks), verdict
    gen = m.generate(toks, 24, keep_logits=True)
    verdict = invariance.alone_vs_batch_decode(m, toks, 24, (0, 5), batch=gen)
    assert verdict.ok and verdict.compared == 2, verdict


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_equals_eager(model, toks, backend):
    m = model.with_backends(backend)
    g = m.generate(toks, 64, keep_logits=True, graphs=True)
    e = m.generate(toks, 64, keep_logits=True, graphs=False)
    verdict = invariance.compare_generations("graph == eager", g, e)
    assert verdict.ok and verdict.compared == 64 and len(g.step_logits) == 64, verdict
    assert g.ids == e.ids


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_chunks_and_decode_across_splits(model, toks, backend, split):
    """1100 tokens: prefilled whole against chunks [0, 500), [500, 530), [530, 1020) (straddling
    512), decode steps 1020 .. 1030 (crossing 1024) and a chunk [1031, 1100)."""
    m = model.with_backends(backend)
    seq = torch.tensor([t for p in toks for t in p] * 16)[:1100]
    assert len(seq) == 1100 and 1100 > 2 * split
    whole = m.logits([seq])[0]
    plan = [("extend", 500), ("extend", 30), ("extend", 490), ("decode", 11), ("extend", 69)]
    got = invariance.piecewise_logits(m, seq, plan, 2048)
    verdict = invariance.compare_positions("prefill == chunks == decode across splits", got, whole)
    assert verdict.ok and verdict.compared == 1100, verdict


@pytest.mark.parametrize("backend", BACKENDS)
def test_alone_equals_in_the_batch_and_graph_equals_eager_across_splits(model, toks, backend, split):
    """A 1020-token prompt (2 splits at 512) alone and in a batch with the 8 prompts: prefill
    logits, then 12 decode steps crossing 1024, graphs and eager."""
    m = model.with_backends(backend)
    long = [t for p in toks for t in p] * 16
    long = long[:1020]
    batch = [long] + toks
    verdict = invariance.compare_items(
        "alone == batch (prefill)", invariance.alone_rows(m, [long]), m.logits(batch)[:1]
    )
    assert verdict.ok, verdict
    g = m.generate(batch, 12, keep_logits=True, graphs=True)
    e = m.generate(batch, 12, keep_logits=True, graphs=False)
    verdict = invariance.compare_generations("graph == eager", g, e)
    assert verdict.ok and verdict.compared == 12, verdict
    verdict = invariance.alone_vs_batch_decode(m, batch, 12, (0,), batch=g)
    assert verdict.ok, verdict


@pytest.mark.skipif(not SM90, reason="the pair needs CUTLASS (sm90a)")
def test_pow2_cutlass_equals_triton_on_the_fast_engine(model, toks):
    a = model.with_backends("cutlass").generate(toks, 64, keep_logits=True)
    b = model.with_backends("triton").generate(toks, 64, keep_logits=True)
    assert a.ids == b.ids and all(same(x, y) for x, y in zip(a.step_logits, b.step_logits))
    la, lb = (
        model.with_backends("cutlass").logits(toks),
        model.with_backends("triton").logits(toks),
    )
    assert all(same(x, y) for x, y in zip(la, lb))


def test_fast_engine_parity_with_transformers(model, toks):
    from requant.checkpoint import open_checkpoint
    from tests.requant.runtime.test_parity import (
        _hf_logits,
        check_against_yardstick,
        deviation,
        hf_qwen3,
        w8a8_tensors,
    )

    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    tensors = w8a8_tensors(ckpt)
    ref32 = hf_qwen3(ckpt.config, tensors, set(ckpt.quantized_linears), torch.float32)
    ref16 = hf_qwen3(ckpt.config, tensors, set(ckpt.quantized_linears), torch.bfloat16)
    m = load_model(
        DEFAULT_CHECKPOINT,
        regime="native",
        backend="triton",
        act_backend="triton",
        device="cuda",
    )
    r32 = _hf_logits(ref32, toks)
    ours = [x.cpu() for x in m.logits(toks)]
    check_against_yardstick(
        deviation(ours, r32),
        deviation(_hf_logits(ref16, toks), r32),
        "fast engine prefill, 8 prompts",
    )
    gen = m.generate(toks, 12, keep_logits=True)
    seqs = [t + gen.ids[i][:-1] for i, t in enumerate(toks)]
    r32, r16 = _hf_logits(ref32, seqs), _hf_logits(ref16, seqs)
    pick = [(i, len(t) - 1 + s) for i, t in enumerate(toks) for s in range(12)]
    dec = [torch.stack([gen.step_logits[s][i].cpu() for i in range(len(toks)) for s in range(12)])]
    check_against_yardstick(
        deviation(dec, [torch.stack([r32[i][p] for i, p in pick])]),
        deviation(
            [torch.stack([r16[i][p] for i, p in pick])],
            [torch.stack([r32[i][p] for i, p in pick])],
        ),
        "fast engine decode, 8 prompts x 12 tokens",
    )
