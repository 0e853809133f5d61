"""requant.scales.device.requantize_nearest equals the converter's numpy path,
requant.scales.requantizer.requantize(q, s, "nearest") (the independent reference: numpy blocks,
rint, explicit clip counting), bit for bit on the weights and the scales, for bf16, fp16 and fp32
scales, with clipping rows, extreme int8 values and scales that are powers of two already."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from requant.scales.device import requantize_nearest
from requant.scales.requantizer import requantize


def _case(seed: int, dtype: torch.dtype, rows: int = 64, cols: int = 96):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (rows, cols), generator=g).to(torch.int8)
    q[0, :4] = torch.tensor([-128, 127, -127, 0], dtype=torch.int8)
    lo, hi = (-20, 4) if dtype == torch.float16 else (-40, 10)
    s = torch.exp2(torch.empty(rows, 1).uniform_(lo, hi, generator=g).to(torch.float64))
    s[1] = 2.0**-7  # a power of two: unchanged
    s[2] = 2.0**-7 * 1.41  # just under sqrt(2): nearest rounds down, q * r up to 1.41 * 127: clips
    s[3] = 2.0**-7 * 1.42  # above sqrt(2): rounds up
    q[2, :8] = 127
    q[2, 8:16] = -128
    return q, s.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_device_nearest_equals_the_numpy_requantizer(dtype):
    for seed in range(6):
        q, s = _case(seed, dtype)
        want_q, want_s = requantize(q, s, "nearest")
        got_q, got_s = requantize_nearest(q, s)
        assert got_q.dtype == torch.int8 and torch.equal(got_q, want_q)
        assert got_s.dtype == want_s.dtype and torch.equal(got_s.view(torch.int8), want_s.view(torch.int8))
    assert bool((want_q[2, :8] == 127).all())  # the clipping row clipped the same way


def test_device_nearest_refuses_what_the_requantizer_refuses():
    q, s = _case(0, torch.bfloat16)
    bad = s.clone()
    bad[5] = 0
    for fn in (lambda: requantize(q, bad, "nearest"), lambda: requantize_nearest(q, bad)):
        with pytest.raises(ValueError, match="finite and positive"):
            fn()
    with pytest.raises(ValueError, match="int8"):
        requantize_nearest(q.to(torch.int16), s)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_nearest_on_cuda_equals_the_numpy_requantizer():
    for dtype in (torch.bfloat16, torch.float32):
        q, s = _case(3, dtype, rows=4096, cols=512)
        want_q, want_s = requantize(q, s, "nearest")
        got_q, got_s = requantize_nearest(q.cuda(), s.cuda())
        assert torch.equal(got_q.cpu(), want_q) and torch.equal(got_s.view(torch.int8), want_s.view(torch.int8))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5))
def test_many_equals_one_at_a_time(seed, count):
    """requantize_nearest_many against requantize_nearest on each pair (proved above against the
    numpy requantizer), drawn over group sizes, row counts, scale dtypes (mixed: one at a time),
    input widths (mixed: one at a time) and a refused scale in one member (the same error)."""
    from requant.scales.device import requantize_nearest_many

    g = torch.Generator().manual_seed(seed)
    pick = lambda n: int(torch.randint(0, n, (1,), generator=g))  # noqa: E731
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    dtype, cols = dtypes[pick(3)], 96
    pairs = []
    for i in range(count):
        d = dtypes[pick(3)] if pick(4) == 0 else dtype
        c = 64 if pick(5) == 0 else cols
        q, s = _case(seed + i, d, rows=4 + pick(40), cols=c)  # _case writes rows 0-3
        pairs.append((q, s))
    if pick(6) == 0:
        bad = pairs[-1][1].clone()
        bad[0] = float("nan")
        pairs[-1] = (pairs[-1][0], bad)
        with pytest.raises(ValueError, match="finite and positive"):
            requantize_nearest(*pairs[-1])
        with pytest.raises(ValueError, match="finite and positive"):
            requantize_nearest_many(pairs)
        return
    got = requantize_nearest_many(pairs)
    assert len(got) == len(pairs)
    for (q, s), (gq, gs) in zip(pairs, got):
        wq, ws = requantize_nearest(q, s)
        assert gq.shape == wq.shape and torch.equal(gq, wq)
        assert gs.dtype == ws.dtype and torch.equal(gs.view(torch.int8), ws.view(torch.int8))
