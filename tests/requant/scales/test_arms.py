"""requant.scales.arms: property tests (hypothesis). Reference: exact rational arithmetic with
Python's fractions.Fraction (round() on a Fraction rounds half to even), and
kernels.bf16.is_power_of_two for the power-of-two check."""

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from requant.kernels.bf16 import is_power_of_two
from requant.scales.arms import (
    ARMS,
    MSE_OFFSETS,
    ceil_exponent,
    nearest_exponent,
    quantize_from_source,
    requantize,
    requantize_with_stats,
)
from requant.scales.from_source import rtn_quantize

SETTINGS = settings(max_examples=60, deadline=None, database=None)  # no ./.hypothesis in the repo


def bf16_from_bits(bits: list[int]) -> torch.Tensor:
    b = torch.tensor(bits, dtype=torch.int32)
    b = torch.where(b >= 0x8000, b - 0x10000, b)
    return b.to(torch.int16).view(torch.bfloat16)


# Positive finite bf16 values, subnormals included: bits 0x0001..0x7F7F.
bf16_bits = st.integers(1, 0x7F7F)
# Positive fp16 values drawn as bit patterns (11-bit mantissas, subnormals included), up to
# 0x7800 = 2^15: above it ceil(log2 s) = 16 and 2^16 is not an fp16 value.
fp16_bits = st.integers(1, 0x7800)
# Positive finite fp32 values, normal range kept moderate so 2^e stays representable.
fp32_vals = st.floats(min_value=2.0**-120, max_value=2.0**120, allow_nan=False, allow_infinity=False, width=32)
# "Realistic" scales: positive normal bf16 between 2^-30 and 2^10.
scale_bits = st.integers(0x3080, 0x4480)


def fp16_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int16).view(torch.float16)


def representable(e: int, dtype: torch.dtype) -> bool:
    """Does dtype hold 2^e exactly? (reference: the exact power of two as a Fraction)"""
    if e < -1074 or e > 1023:
        return False
    x = torch.tensor(2.0**e, dtype=torch.float64).to(dtype)
    return bool(torch.isfinite(x)) and Fraction(float(x)) == Fraction(2) ** e


def frac_ceil_exponent(s: Fraction) -> int:
    """Smallest e with 2^e >= s (exact)."""
    e = s.numerator.bit_length() - s.denominator.bit_length() - 2
    while Fraction(2) ** e < s:
        e += 1
    return e


def frac_nearest_exponent(s: Fraction) -> int:
    """The integer nearest to log2 s: between f = floor and f + 1, pick f + 1 iff
    log2 s >= f + 1/2, i.e. s^2 >= 2^(2f+1) (exact; equality is impossible for rationals)."""
    c = frac_ceil_exponent(s)
    if Fraction(2) ** c == s:
        return c
    f = c - 1
    return c if s * s >= Fraction(2) ** (2 * f + 1) else f


def frac_requant(q: int, s: Fraction, s_new: Fraction) -> tuple[int, bool]:
    v = round(Fraction(q) * s / s_new)  # half to even
    return max(-128, min(127, v)), not (-128 <= v <= 127)


@SETTINGS
@given(st.lists(bf16_bits, min_size=1, max_size=64))
def test_exponents_bf16_match_fractions(bits):
    s = bf16_from_bits(bits)
    ce, ne = ceil_exponent(s), nearest_exponent(s)
    for i, x in enumerate(s.tolist()):
        fx = Fraction(x)
        assert int(ce[i]) == frac_ceil_exponent(fx)
        assert int(ne[i]) == frac_nearest_exponent(fx)


@SETTINGS
@given(st.lists(fp32_vals, min_size=1, max_size=64))
def test_exponents_fp32_match_fractions(vals):
    s = torch.tensor(vals, dtype=torch.float32)
    ce, ne = ceil_exponent(s), nearest_exponent(s)
    for i, x in enumerate(s.tolist()):
        assert int(ce[i]) == frac_ceil_exponent(Fraction(x))
        assert int(ne[i]) == frac_nearest_exponent(Fraction(x))


def test_nearest_boundary_is_sqrt_half():
    """m just below / above 2^-1/2 = 0.70710678...: bf16 neighbours 0.70703125 and 0.7109375."""
    s = torch.tensor([0.70703125, 0.7109375, 0.5, 1.0, 0.75], dtype=torch.bfloat16)
    assert nearest_exponent(s).tolist() == [-1, 0, -1, 0, 0]
    assert ceil_exponent(s).tolist() == [0, 0, -1, 0, 0]


@st.composite
def linears(draw, dtype=torch.bfloat16, max_rows=6, max_cols=24):
    rows = draw(st.integers(1, max_rows))
    cols = draw(st.integers(1, max_cols))
    q = draw(st.lists(st.integers(-128, 127), min_size=rows * cols, max_size=rows * cols))
    if dtype == torch.float32:
        sv = draw(st.lists(st.floats(2.0**-40, 2.0**10, width=32), min_size=rows, max_size=rows))
        s = torch.tensor(sv, dtype=torch.float32).reshape(rows, 1)
    elif dtype == torch.float16:
        s = fp16_from_bits(draw(st.lists(fp16_bits, min_size=rows, max_size=rows))).reshape(rows, 1)
    else:
        sb = draw(st.lists(scale_bits, min_size=rows, max_size=rows))
        s = bf16_from_bits(sb).reshape(rows, 1).to(dtype)
    return torch.tensor(q, dtype=torch.int8).reshape(rows, cols), s


@pytest.mark.parametrize("arm", ["nearest", "ceiling"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@SETTINGS
@given(data=st.data())
def test_requantize_is_exact(arm, dtype, data):
    """q' = clamp(round_half_even(q s / s')) computed exactly, s' = 2^(nearest|ceil)."""
    q, s = data.draw(linears(dtype=dtype))
    q2, s2, stats = requantize_with_stats(q, s, arm)
    assert q2.dtype == torch.int8 and s2.dtype == s.dtype and q2.shape == q.shape and s2.shape == s.shape
    assert bool(is_power_of_two(s2).all())
    clipped = 0
    for i in range(q.shape[0]):
        fs = Fraction(float(s[i, 0]))
        e = frac_nearest_exponent(fs) if arm == "nearest" else frac_ceil_exponent(fs)
        assert Fraction(float(s2[i, 0])) == Fraction(2) ** e
        for j in range(q.shape[1]):
            want, clip = frac_requant(int(q[i, j]), fs, Fraction(2) ** e)
            assert int(q2[i, j]) == want
            clipped += clip
    assert stats.weights_clipped == clipped
    assert stats.scales_changed == int((s2.double() != s.double()).sum())


@SETTINGS
@given(data=st.data())
def test_ceiling_never_clips(data):
    q, s = data.draw(linears())
    # the worst case for clipping: every row holds both -128 and 127
    q[:, 0] = -128
    q[:, -1] = 127
    q2, s2, stats = requantize_with_stats(q, s, "ceiling")
    assert stats.weights_clipped == 0
    assert bool((s2.double() >= s.double()).all())
    # no clipping means |q'| <= |q| s/s' + 1/2 everywhere
    bound = q.double().abs() * (s.double() / s2.double()) + 0.5
    assert bool((q2.double().abs() <= bound).all())


@SETTINGS
@given(data=st.data())
def test_unconstrained_is_the_identity(data):
    q, s = data.draw(linears())
    q2, s2 = requantize(q, s, "unconstrained")
    assert torch.equal(q2, q) and torch.equal(s2.view(torch.int16), s.view(torch.int16))


@SETTINGS
@given(data=st.data())
def test_probe_keeps_weights_and_rounds_scales(data):
    q, s = data.draw(linears())
    q2, s2 = requantize(q, s, "probe")
    assert torch.equal(q2, q)
    assert torch.equal(s2, requantize(q, s, "nearest")[1])


@SETTINGS
@given(data=st.data())
def test_power_of_two_input_is_a_fixed_point(data):
    """A checkpoint already on powers of two is left exactly as it is by every arm but mse's
    search (which may still move a channel to a better exponent)."""
    q, s = data.draw(linears())
    s = requantize(q, s, "ceiling")[1]
    for arm in ("nearest", "ceiling", "probe"):
        q2, s2 = requantize(q, s, arm)
        assert torch.equal(q2, q) and torch.equal(s2, s)


def frac_channel_error(q_row, s: Fraction, q2_row, s2: Fraction) -> Fraction:
    return sum((Fraction(int(b)) * s2 - Fraction(int(a)) * s) ** 2 for a, b in zip(q_row, q2_row))


def frac_mse_errors(q_row, fs: Fraction, dtype: torch.dtype) -> dict[int, Fraction]:
    """{offset: exact squared error} for every MSE candidate that dtype can hold."""
    ce = frac_ceil_exponent(fs)
    return {
        o: sum(
            (
                Fraction(frac_requant(int(a), fs, Fraction(2) ** (ce + o))[0]) * Fraction(2) ** (ce + o)
                - Fraction(int(a)) * fs
            )
            ** 2
            for a in q_row
        )
        for o in MSE_OFFSETS
        if representable(ce + o, dtype)
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@SETTINGS
@given(data=st.data())
def test_mse_is_no_worse_than_nearest_or_ceiling_per_channel(dtype, data):
    """Exact for bf16/fp16 scales. For fp32 scales the squared errors are rounded to float64
    (the arms docstring says so), so a near-tie may go either way: there the chosen error
    may exceed the best by float64 rounding (relative 2^-45 here), never more."""
    q, s = data.draw(linears(dtype=dtype, max_cols=16))
    qm, sm = requantize(q, s, "mse")
    assert bool(is_power_of_two(sm).all()) and sm.dtype == dtype
    qn, sn = requantize(q, s, "nearest")
    qc, sc = requantize(q, s, "ceiling")
    slack = Fraction(1) if dtype != torch.float32 else 1 + Fraction(1, 2**45)
    for i in range(q.shape[0]):
        fs = Fraction(float(s[i, 0]))
        em = frac_channel_error(q[i], fs, qm[i], Fraction(float(sm[i, 0])))
        assert em <= slack * frac_channel_error(q[i], fs, qn[i], Fraction(float(sn[i, 0])))
        assert em <= slack * frac_channel_error(q[i], fs, qc[i], Fraction(float(sc[i, 0])))
        # and it is the best of its candidates, each requantized exactly
        errs = frac_mse_errors(q[i], fs, dtype)
        best = min(errs.values())
        if dtype != torch.float32:
            assert em == best
            # ties go to the first candidate in MSE_OFFSETS order
            first = next(o for o in MSE_OFFSETS if errs.get(o) == best)
            assert Fraction(float(sm[i, 0])) == Fraction(2) ** (frac_ceil_exponent(fs) + first)
        else:
            assert best <= em <= slack * best


def test_mse_candidacy_is_per_channel():
    """A candidate 2^e that the scale dtype cannot hold for ONE channel (here 2^(ceil-3) =
    2^-25 for the fp16 subnormal scale 1.5*2^-23) is dropped for that channel only: the other
    channels choose exactly as they do alone, and as the Fraction brute force over their
    representable candidates says. Row 0 (s = 0.625, odd q) is exact only at ceil-3."""
    s = torch.tensor([[0.625], [1.5 * 2**-23], [0.625 * 2**-3], [0.8], [3.0 * 2**-24]], dtype=torch.float16)
    g = torch.Generator().manual_seed(0)
    q = (torch.randint(-12, 12, (s.shape[0], 24), generator=g) * 2 + 1).to(torch.int8)
    qm, sm, stm = requantize_with_stats(q, s, "mse")
    for i in range(q.shape[0]):
        qi, si = requantize(q[i : i + 1], s[i : i + 1], "mse")
        assert torch.equal(qi, qm[i : i + 1]) and torch.equal(si.view(torch.int16), sm[i : i + 1].view(torch.int16))
        fs = Fraction(float(s[i, 0]))
        errs = frac_mse_errors(q[i], fs, torch.float16)
        best = min(errs.values())
        first = next(o for o in MSE_OFFSETS if errs[o] == best)
        assert Fraction(float(sm[i, 0])) == Fraction(2) ** (frac_ceil_exponent(fs) + first)
        assert frac_channel_error(q[i], fs, qm[i], Fraction(float(sm[i, 0]))) == best
    assert not representable(frac_ceil_exponent(Fraction(1.5 * 2**-23)) - 3, torch.float16)
    assert float(sm[0, 0]) == 2.0**-3  # ceil - 3: what the whole-tensor drop used to forbid
    assert stm.exponent_shifts[-3] >= 1


def test_from_source_candidacy_is_per_channel():
    """quantize_from_source, fp16 scales: one channel's scale ~40000 has ceil(log2 s) = 16,
    and 2^16 is no fp16 value; the other channels still get their ceiling candidate and
    choose exactly as they do alone."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 32, generator=g) * 0.02
    w[1] *= 40000 * 127.5 / w[1].abs().max()
    w[2] *= 127.5 * 1.5 * 2**-23 / w[2].abs().max()
    qm, sm, _ = quantize_from_source(w, "mse", torch.float16)
    assert float(sm[1, 0]) == 2.0**15
    for i in range(3):
        qi, si, _ = quantize_from_source(w[i : i + 1], "mse", torch.float16)
        assert torch.equal(qi, qm[i : i + 1]) and torch.equal(si.view(torch.int16), sm[i : i + 1].view(torch.int16))


def test_bad_inputs_are_refused():
    q = torch.zeros(2, 3, dtype=torch.int8)
    for s in (
        torch.tensor([[0.0], [1.0]]),
        torch.tensor([[-1.0], [1.0]]),
        torch.tensor([[float("nan")], [1.0]]),
        torch.tensor([[float("inf")], [1.0]]),
    ):
        with pytest.raises(ValueError):
            requantize(q, s.to(torch.bfloat16), "nearest")
    with pytest.raises(ValueError, match="shape"):
        requantize(q, torch.ones(3, 1, dtype=torch.bfloat16), "nearest")
    with pytest.raises(ValueError, match="int8"):
        requantize(q.to(torch.int16), torch.ones(2, 1, dtype=torch.bfloat16), "nearest")
    with pytest.raises(ValueError, match="unknown arm"):
        requantize(q, torch.ones(2, 1, dtype=torch.bfloat16), "floor")


def test_unrepresentable_power_of_two_is_an_error():
    """The largest bf16 rounds up to 2^128, which bf16 cannot hold: an error, not inf."""
    s = torch.tensor([[3.3895e38]], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not representable"):
        requantize(torch.ones(1, 4, dtype=torch.int8), s, "ceiling")


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 20), st.integers(0, 2**31))
def test_from_source(rows, cols, seed):
    """--source: unconstrained is llm-compressor's RTN exactly; nearest/ceiling quantize the
    bf16 weight straight to the power-of-two scale (reference: Fractions)."""
    w = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.02).to(torch.bfloat16)
    q_rtn, s_rtn = rtn_quantize(w)
    q, s, _ = quantize_from_source(w, "unconstrained")
    assert torch.equal(q, q_rtn) and torch.equal(s.view(torch.int16), s_rtn.view(torch.int16))
    for arm, fexp in (("nearest", frac_nearest_exponent), ("ceiling", frac_ceil_exponent)):
        q2, s2, st_ = quantize_from_source(w, arm)
        for i in range(rows):
            e = fexp(Fraction(float(s_rtn[i, 0])))
            assert Fraction(float(s2[i, 0])) == Fraction(2) ** e
            for j in range(cols):
                v = round(Fraction(float(w[i, j])) / Fraction(2) ** e)
                assert int(q2[i, j]) == max(-128, min(127, v))
        if arm == "ceiling":
            # s' >= the bf16 RTN scale, which may sit below absmax/127.5: |w / s'| <= 128, so at
            # most a channel maximum clips, by less than one step (as in llm-compressor's RTN)
            assert bool(((w.double() / s2.double()).abs() <= 128).all())
    qm, sm, stm = quantize_from_source(w, "mse")
    qc, sc, stc = quantize_from_source(w, "ceiling")
    assert stm.sq_error <= stc.sq_error
    assert bool(is_power_of_two(sm).all())


def test_all_arms_listed():
    assert set(ARMS) == {"unconstrained", "nearest", "ceiling", "mse", "probe"}


@pytest.mark.parametrize("arm", ARMS)
@SETTINGS
@given(data=st.data())
def test_streaming_blocks_equal_whole_tensor(arm, data):
    """Requantizer fed in arbitrary blocks of rows (as the converter does) gives the same
    bytes and the same counts as one call on the whole weight."""
    from requant.scales.arms import Requantizer, requantize_with_stats

    q, s = data.draw(linears(max_rows=12))
    q_ref, s_ref, st_ref = requantize_with_stats(q, s, arm)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, q.shape[0] - 1), max_size=4)) if q.shape[0] > 1 else []))
    rq = Requantizer(s, arm, q.shape[1])
    parts = []
    for a, b in zip([0] + cuts, cuts + [q.shape[0]]):
        parts.append(torch.from_numpy(rq.rows(q[a:b].numpy(), a).copy()))
    s_new, st_new = rq.finish()
    assert torch.equal(torch.cat(parts), q_ref) and torch.equal(s_new.view(torch.int16), s_ref.view(torch.int16))
    assert st_new.weights_clipped == st_ref.weights_clipped and st_new.exponent_shifts == st_ref.exponent_shifts
    assert st_new.scales_changed == st_ref.scales_changed
