"""kernels/ops.py, the reference engine's torch ops. References, per test: RoPE against the
rotation formula; RMSNorm against its definition; tree_sum_halves against a pairwise loop over
Python floats rounded to fp32 with numpy; dense rows against float64 dot products; decode
attention against prompt attention and against padding."""

import numpy as np
import pytest
import torch

from requant.kernels.bf16 import bitwise_equal, ulp_distance
from requant.kernels.ops import DENSE_CHUNK, attend_decode, attend_prompt, dense_rows, rms_norm, rope, tree_sum_halves


def test_rope_convention():
    """Rotate-half RoPE (HF Qwen3): position 0 is the identity; pair (i, i + d/2) of position t
    is rotated by t * theta**(-2i/d): x = e_i goes to (cos, sin) of that angle."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 8, generator=g).to(torch.bfloat16)
    assert bitwise_equal(rope(x, 10000.0), x)
    e = torch.zeros(4, 1, 8, dtype=torch.bfloat16)
    e[:, 0, 1] = 1.0
    got = rope(e, 10000.0)
    ang = torch.arange(4, dtype=torch.float32) * (1.0 / (10000.0 ** torch.tensor(2 / 8, dtype=torch.float32)))
    assert bitwise_equal(got[:, 0, 1], ang.cos().to(torch.bfloat16))
    assert bitwise_equal(got[:, 0, 5], ang.sin().to(torch.bfloat16))
    assert int((got != 0).sum()) <= 8  # nothing else moves (signed zeros aside)


@pytest.mark.parametrize("tree", [False, True])
def test_rms_norm_definition(tree):
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    y = rms_norm(x, w, 0.0, tree=tree)
    want = torch.tensor([[3.0, 4.0]]) / (12.5**0.5)
    assert bitwise_equal(y, (want.to(torch.bfloat16).to(torch.float32) * torch.tensor([1.0, 2.0])).to(torch.bfloat16))


def _pairwise_reference(row: np.ndarray) -> np.float32:
    """i + n/2 pairing, halves again, over fp32 values (numpy float32 adds round once)."""
    n = 1 << max(len(row) - 1, 0).bit_length()
    v = [np.float32(x) for x in row] + [np.float32(0)] * (n - len(row))
    while len(v) > 1:
        h = len(v) // 2
        v = [np.float32(v[i] + v[i + h]) for i in range(h)]
    return v[0]


def test_tree_sum_halves_order_and_padding():
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 5, 64, 100):
        x = torch.randn(3, n, generator=g) * torch.logspace(-3, 3, n)
        got = tree_sum_halves(x, -1)
        assert got.shape == (3, 1)
        for r in range(3):
            assert got[r, 0].item() == float(_pairwise_reference(x[r].numpy()))
        # zero padding to any longer length leaves every sum's bits unchanged
        padded = torch.cat([x, torch.zeros(3, 3 * n + 7)], dim=1)
        assert bitwise_equal(tree_sum_halves(padded, -1), got)
        assert bitwise_equal(tree_sum_halves(x.T.contiguous(), 0).T, got)  # any dim


def test_dense_rows_are_batch_invariant_and_accurate():
    """Every row of a call equals that row computed alone, bit for bit, for batches that
    span several fixed-size blocks; against float64 dot products (rounded to bf16) the
    fp32 accumulation is within one bf16 spacing."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2 * DENSE_CHUNK + 22, 96, generator=g).to(torch.bfloat16)
    w = torch.randn(40, 96, generator=g).to(torch.bfloat16).to(torch.float32)
    full = dense_rows(x, w)
    for i in (0, 1, DENSE_CHUNK - 1, DENSE_CHUNK, len(x) - 1):
        assert bitwise_equal(dense_rows(x[i : i + 1], w)[0], full[i])
    assert bitwise_equal(dense_rows(x[5:77], w), full[5:77])
    exact = (x.to(torch.float64) @ w.to(torch.float64).T).to(torch.bfloat16)
    assert int(ulp_distance(full, exact).max()) <= 1


def test_decode_attention_against_prompt_attention():
    """attend_decode (tree sums) and attend_prompt (matmuls) compute the same formula in a
    different fp32 summation order; the bf16 results may differ by one spacing where a
    probability or output sits at a bf16 rounding boundary (measured: 0 of 20,480 elements
    over 40 random cases). Padding to a longer cache changes no bit."""
    worst, differing, total = 0, 0, 0
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        t = int(torch.randint(1, 90, (1,), generator=g))
        q = (torch.randn(t, 8, 32, generator=g) * 3).to(torch.bfloat16)
        k = (torch.randn(t, 2, 32, generator=g) * 3).to(torch.bfloat16)
        v = torch.randn(t, 2, 32, generator=g).to(torch.bfloat16)
        ref = attend_prompt(q, k, v, 32**-0.5)[-1]
        outs = []
        for cap in (128, 512):
            kc = torch.zeros(1, 2, cap, 32, dtype=torch.bfloat16)
            vc = torch.zeros_like(kc)
            kc[0, :, :t], vc[0, :, :t] = k.transpose(0, 1), v.transpose(0, 1)
            outs.append(attend_decode(q[-1:].contiguous(), kc, vc, torch.tensor([t]), 32**-0.5)[0])
        assert bitwise_equal(outs[0], outs[1])
        d = ulp_distance(outs[0], ref)
        worst, differing, total = max(worst, int(d.max())), differing + int((d > 0).sum()), total + d.numel()
    assert worst <= 1 and differing <= total // 1000


def test_decode_attention_zero_sums_are_positive_zero():
    """A value column of zeros and negative zeros sums to +0 whatever the padding (the
    final + 0 of attend_decode): otherwise -0 vs +0 would depend on the batch's longest."""
    kc = torch.zeros(1, 1, 8, 4, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc[0, 0, :2] = 1.0
    vc[0, 0, :2, 0] = -0.0
    vc[0, 0, :2, 1] = -1.0
    q = torch.ones(1, 1, 4, dtype=torch.bfloat16)
    for span in (2, 4, 8):
        out = attend_decode(q, kc[:, :, :span], vc[:, :, :span], torch.tensor([2]), 0.5)
        assert out[0, 0].item() == 0.0 and not torch.signbit(out[0, 0]) and out[0, 1].item() == -1.0
