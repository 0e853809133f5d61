"""The portable arithmetic: its Triton kernels (kernels/triton/portable.py, under TRITON_INTERPRET=1
here; compiled on a GPU) against its torch specification (kernels/portable.py), bit for bit, and the
specification against independent float64 references for accuracy.

References: float64 exp2/exp/sin/cos (torch's libm, accuracy only: the spec is not libm); for the
attention and the lm_head, the float64 softmax and matmul (closeness); for bits, the torch spec, which
shares no code with the kernels (different languages: torch tensors against Triton's blocks)."""

import math

import pytest
import torch

from requant.kernels import portable as P
from requant.kernels.reference import quantize_activations
from requant.kernels.triton import _launch
from requant.kernels.triton import portable as TP

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    DEV == "cpu" and not _launch.INTERPRET, reason="Triton needs CUDA or TRITON_INTERPRET=1"
)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _special():
    return torch.tensor(
        [0.0, -0.0, 1e-40, -1e-40, 2.0**-31, -(2.0**-31), 2.0**-30, -(2.0**-30), math.inf, -math.inf, math.nan]
        + [127.0, 127.99, 128.0, -125.0, -125.5, -126.0, -149.0, -150.0, 0.5, -0.5, 1.0, -1.0, 88.7, -87.3],
        dtype=torch.float32,
    )


def test_exp_accuracy_against_float64():
    x = torch.cat([torch.linspace(-150, 128, 400_001, dtype=torch.float32), _special()])
    for fn, ref in ((P.exp2, torch.exp2), (P.exp, torch.exp)):
        y = fn(x)
        r = ref(x.double())
        ok = (r >= 2.0**-125) & (r < 3.0e38)
        rel = ((y.double() - r) / r)[ok].abs().max().item()
        assert rel < 4 * 2.0**-24  # within a few ulp (measured: under 2)
        assert bool((y[r < 2.0**-126] == 0).all())  # the spec flushes results below 2**-125 to 0
        assert torch.isnan(y[torch.isnan(x)]).all() and bool((y[x == math.inf] == math.inf).all())


@needs_triton
def test_exp_kernels_equal_the_spec_bit_for_bit():
    # every 64th fp32 pattern in [-150, 0] and a dense grid above, plus the special values
    neg = torch.arange(0x80000000, 0xC3160000, 64 if DEV == "cuda" else 4099, dtype=torch.int64)
    xs = torch.cat([(neg - 2**32).to(torch.int32).view(torch.float32), torch.linspace(0, 128, 50_001), _special()])
    for base_e, fn in ((False, P.exp2), (True, P.exp)):
        got = TP.elementwise_exp(xs.to(DEV), base_e=base_e)
        assert torch.equal(bits(got), bits(fn(xs)))


def test_rope_tables_are_accurate():
    cos, sin = P.rope_tables(4096, 128, 1_000_000.0)
    inv = 1.0 / (1_000_000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None, :]
    assert (cos[:, :64].double() - ang.cos()).abs().max() < 2e-7 and torch.equal(cos[:, :64], cos[:, 64:])
    assert (sin[:, :64].double() - ang.sin()).abs().max() < 2e-7 and torch.equal(sin[:, :64], sin[:, 64:])


def _bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def test_lane_dot_is_close_to_float64():
    g = torch.Generator().manual_seed(0)
    a, b = _bf16(g, 64, 200), _bf16(g, 64, 200)
    got = P.lane_dot(a.float(), b.float()).double()
    ref = (a.double() * b.double()).sum(-1)
    assert (got - ref).abs().max() < 1e-5


@needs_triton
@pytest.mark.parametrize("m", [1, 3, 9])
def test_dense_kernel_equals_the_spec(m):
    g = torch.Generator().manual_seed(m)
    x, w = _bf16(g, m, 80), _bf16(g, 300, 80, scale=0.1)
    x[0, :5] = 0
    x[-1, ::3] *= 2.0**-120  # products that underflow: rounded as the kernel rounds them
    w[::7, ::3] *= 2.0**-120
    got = TP.dense(x.to(DEV), w.to(DEV))
    want = P.dense(x, w)
    assert torch.equal(bits(got), bits(want))
    assert (want - (x.double() @ w.double().T)).abs().max() < 2.0**-7 * 4


@needs_triton
def test_silu_kernel_equals_the_spec():
    g = torch.Generator().manual_seed(1)
    gu = _bf16(g, 5, 2 * 96, scale=4.0)
    gu[1, :3] = torch.tensor([100.0, -100.0, 0.0])
    gu[2] = 0
    q, s = TP.silu_mul_quantize(gu.to(DEV))
    wq, ws = quantize_activations(P.silu_mul(gu), check=False)
    assert torch.equal(q.cpu(), wq) and torch.equal(bits(s), bits(ws))


def _cache(g, rows, kv, cap, d):
    return _bf16(g, rows, kv, cap, d), _bf16(g, rows, kv, cap, d)


def _blocks(lengths, starts, per):
    pos, rows, blocks, off = [], [], [], 0
    for row, (start, n) in enumerate(zip(starts, lengths)):
        pos += list(range(start, start + n))
        rows += [row] * n
        blocks += [(off + i, min(per, n - i), row) for i in range(0, n, per)]
        off += n
    return (
        torch.tensor(pos, dtype=torch.int32),
        torch.tensor(rows, dtype=torch.int32),
        torch.tensor(blocks, dtype=torch.int32),
    )


@needs_triton
@pytest.mark.parametrize("heads,kv,d,split", [(2, 1, 16, 32), (4, 2, 32, 512), (3, 1, 64, 16)])
def test_attention_kernel_equals_the_spec(heads, kv, d, split):
    g = torch.Generator().manual_seed(heads * 100 + d)
    cap = 64
    kc, vc = _cache(g, 2, kv, cap, d)
    lengths, starts = [5, 2], [0, 37]
    pos, rows, blocks = _blocks(lengths, starts, TP.tokens_per_block(heads, kv))
    q = _bf16(g, len(pos), heads, d)
    got = TP.attention(q.to(DEV), kc.to(DEV), vc.to(DEV), pos.to(DEV), blocks.to(DEV), d**-0.5, split=split)
    want = P.attention(q, kc, vc, pos, rows, d**-0.5, split=split)
    assert torch.equal(bits(got), bits(want))
    # close to the exact softmax (float64)
    for i, (p, r) in enumerate(zip(pos.tolist(), rows.tolist())):
        for h in range(heads):
            k = kc[r, h // (heads // kv), : p + 1].double()
            v = vc[r, h // (heads // kv), : p + 1].double()
            w = torch.softmax((k @ q[i, h].double()) * d**-0.5, 0)
            ref = w @ v
            assert (want[i, h * d : (h + 1) * d].double() - ref).abs().max() < 0.02 * (1 + ref.abs().max())


@needs_triton
@pytest.mark.parametrize("seed,tokens", [(0, 2), (1, 3), (2, 5), (3, 8)])
def test_attention_tokens_per_program_change_no_bit(seed, tokens, monkeypatch):
    """PREFILL_TOKENS (query tokens an attention program holds in prefill) with the head layout and
    the sequences drawn: the kernel equals the spec at every choice (a row's arithmetic never depends
    on its program's other rows), and so do blocks of one token (decode) under it."""
    g = torch.Generator().manual_seed(1000 + seed)

    def draw(hi):
        return int(torch.randint(1, hi + 1, (), generator=g))

    kv = draw(2)
    heads = kv * draw(4)
    d, split, cap = 16, 16, 48
    monkeypatch.setattr(TP, "PREFILL_TOKENS", tokens)
    lengths = [draw(20) for _ in range(draw(3))]
    starts = [int(torch.randint(0, cap - n + 1, (), generator=g)) for n in lengths]
    kc, vc = _cache(g, len(lengths), kv, cap, d)
    for per in (TP.tokens_per_block(heads, kv), 1):
        pos, rows, blocks = _blocks(lengths, starts, per)
        q = _bf16(g, len(pos), heads, d)
        got = TP.attention(q.to(DEV), kc.to(DEV), vc.to(DEV), pos.to(DEV), blocks.to(DEV), d**-0.5, split=split)
        want = P.attention(q, kc, vc, pos, rows, d**-0.5, split=split)
        assert torch.equal(bits(got), bits(want)), (heads, kv, tokens, per, lengths, starts)
    assert TP.tokens_per_block(heads, kv) == tokens
