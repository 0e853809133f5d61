"""The exact oracle itself (kernels.reference): accumulator, the two epilogue orders,
the exact rounding, operand checks. Reference implementations named per test."""

from fractions import Fraction

import pytest
import torch

from requant.kernels import reference as ref
from requant.kernels.bf16 import bitwise_equal, round_fp32_to_bf16, ulp_distance
from tests.kernels.operands import random_operands as _operands
from tests.kernels.operands import tiny_rows


def test_accumulate_matches_int64():
    """reference: accumulate_int64 (plain integer arithmetic)."""
    a, w, _, _ = _operands(33, 29, 1000)
    a[0] = -128
    w[:3] = -128
    acc = ref.accumulate(a, w)
    assert acc.dtype == torch.int32
    assert torch.equal(acc.to(torch.int64), ref.accumulate_int64(a, w))


def test_accumulate_past_2_24_is_exact():
    """reference: Python integers. |acc| = K * 2**14 > 2**24 is beyond fp32 integers."""
    k = 4096
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((3, k), -128, dtype=torch.int8)
    w[1, 0] = 127  # one odd term: the sum is no longer a round power of two
    acc = ref.accumulate(a, w)
    assert int(acc[0, 0]) == k * 128 * 128
    assert int(acc[0, 1]) == (k - 1) * 128 * 128 + (-128 * 127)
    assert int(acc[0, 0]) > 2**24


@pytest.mark.parametrize("order", ["cutlass", "triton"])
def test_epilogue_orders_follow_their_definition(order):
    """reference: float64 emulation of each fp32 step, rounded to fp32 after every op."""
    a, w, s_a, s_w = _operands(17, 23, 300, seed=1)
    acc = ref.accumulate(a, w)
    acc32 = acc.to(torch.float64).to(torch.float32).to(torch.float64)  # int32 -> fp32 RN
    sa = s_a.to(torch.float64)
    sw = s_w.reshape(1, -1).to(torch.float64)
    if order == "cutlass":
        y32 = (sa * (sw * acc32).to(torch.float32).to(torch.float64)).to(torch.float32)
        got = ref.epilogue_cutlass_order(acc, s_a, s_w)
    else:
        y32 = ((sa * acc32).to(torch.float32).to(torch.float64) * sw).to(torch.float32)
        got = ref.epilogue_triton_order(acc, s_a, s_w)
    assert bitwise_equal(got, round_fp32_to_bf16(y32))


def test_epilogue_exact_against_fractions():
    """reference: Fraction arithmetic, rounded once to bf16 with ties to even."""
    a, w, s_a, s_w = _operands(9, 11, 200, seed=2)
    acc = ref.accumulate(a, w)
    got = ref.epilogue_exact(acc, s_a, s_w)
    for i in range(9):
        for j in range(11):
            v = Fraction(int(acc[i, j])) * Fraction(float(s_a[i, 0])) * Fraction(float(s_w[j, 0]))
            assert float(got[i, j]) == ref._round_fraction_to_bf16(v)


def test_orders_equal_under_power_of_two_weight_scales():
    """reference: each order's emulation; with s_w = 2**e both are exact scalings of one product."""
    a, w, s_a, s_w = _operands(64, 96, 512, seed=3, pow2=True)
    assert bitwise_equal(ref.scaled_mm_cutlass_order(a, w, s_a, s_w), ref.scaled_mm_triton_order(a, w, s_a, s_w))
    assert bitwise_equal(ref.scaled_mm_cutlass_order(a, w, s_a, s_w), ref.scaled_mm_exact(a, w, s_a, s_w))


def test_orders_within_one_spacing_otherwise():
    """reference: each order's emulation; general s_w, at most one bf16 spacing apart."""
    a, w, s_a, s_w = _operands(128, 256, 512, seed=4)
    d = ulp_distance(ref.scaled_mm_cutlass_order(a, w, s_a, s_w), ref.scaled_mm_triton_order(a, w, s_a, s_w))
    assert int(d.max()) <= 1


def test_check_operands_refuses():
    a, w, s_a, s_w = _operands(4, 8, 16)
    with pytest.raises(TypeError):
        ref.check_operands(a.float(), w, s_a, s_w)
    with pytest.raises(ValueError):
        ref.check_operands(a, w[:, :8], s_a, s_w)
    with pytest.raises(ValueError):
        ref.check_operands(a, w, s_a[:3], s_w)
    big = torch.zeros(1, ref.MAX_K + 1, dtype=torch.int8)
    with pytest.raises(ValueError, match="exceeds"):
        ref.check_operands(big, big, torch.ones(1, 1), torch.ones(1, 1))


def test_quantize_reference_spec():
    """reference: numpy float32 arithmetic (IEEE divisions, np.rint half to even), an
    implementation independent of torch's."""
    import numpy as np

    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 300, generator=g).to(torch.bfloat16)
    x[3] = 0
    q, s = ref.quantize_activations(x)
    xf = x.float().numpy()
    amax = np.abs(xf).max(axis=1, keepdims=True).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_np = np.where(amax == 0, np.float32(0), amax / np.float32(127)).astype(np.float32)
        inv = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
    q_np = np.clip(np.rint(xf * inv), -128, 127).astype(np.int8)  # np.rint: half to even
    assert np.array_equal(s.numpy(), s_np)
    assert np.array_equal(q.numpy(), q_np)
    assert torch.all(q[3] == 0) and float(s[3]) == 0.0


def _quantize_numpy(x: torch.Tensor):
    """The contract in numpy float32, row by row (independent of torch): s = fp32(absmax / 127);
    rows with absmax < 2**-64 scaled by 2**64 first (exact), inv = fp32(127 / absmax'), q =
    clip(rint(fp32(x' * inv))); a zero row s = 0, q = 0; a row with NaN or inf: s = the poison NaN
    (POISON_SCALE_BITS), q = 0."""
    import numpy as np

    xf = x.float().numpy()
    q = np.zeros(xf.shape, dtype=np.int8)
    s = np.zeros((xf.shape[0], 1), dtype=np.float32)
    for i, row in enumerate(xf):
        if not np.all(np.isfinite(row)):
            s[i, 0] = np.array([ref.POISON_SCALE_BITS], dtype=np.int32).view(np.float32)[0]
            continue
        amax = np.float32(np.abs(row).max()) if row.size else np.float32(0)
        if amax == 0:
            continue
        s[i, 0] = amax / np.float32(127)
        up = np.float32(2.0**64) if amax < 2.0**-64 else np.float32(1)
        inv = np.float32(127) / np.float32(amax * up)
        q[i] = np.clip(np.rint((row * up).astype(np.float32) * inv), -128, 127).astype(np.int8)
    return q, s


def _draw_rows(seed: int):
    """(x, kinds drawn): one case of the space below."""
    g = torch.Generator().manual_seed(seed)
    dtype = [torch.bfloat16, torch.float16, torch.float32][seed % 3]
    lo, hi = {torch.bfloat16: (-133, 120), torch.float16: (-24, 14), torch.float32: (-149, 120)}[dtype]
    m, k = int(torch.randint(1, 41, (), generator=g)), [0, 1, 7, 96, 300][seed % 5]
    exps = torch.randint(lo, hi, (m, 1), generator=g).float()
    x = (torch.randn(m, k, generator=g) * torch.exp2(exps)).to(dtype)
    kind = torch.randint(0, 10, (m,), generator=g) if k else torch.full((m,), 9)
    x[kind == 0] = 0
    x[kind == 1] = 0  # one value at the dtype's smallest magnitude, the rest zero
    if k:
        x[kind == 1, 0] = torch.tensor(2.0**lo, dtype=dtype)
    if seed % 2 and k:
        x[kind == 2, k // 2] = float("nan")
        x[kind == 3, 0] = float("inf") if seed % 4 == 1 else -float("inf")
    drawn = {str(dtype), "k0" if k == 0 else "k>0"}
    drawn |= {name for i, name in enumerate(["zero", "tiny"]) if (kind == i).any()}
    drawn |= {name for i, name in ((2, "nan"), (3, "inf")) if seed % 2 and (kind == i).any()}
    return x, drawn


QUANTIZE_CASES = 24


@pytest.mark.parametrize("seed", range(QUANTIZE_CASES))
def test_quantize_generated_rows_equal_the_numpy_contract(seed):
    """reference: _quantize_numpy above. Drawn (_draw_rows): bf16, fp16, fp32; M 1 to 40, K 0 to
    300; each row's magnitude from the smallest subnormal of its dtype to near its largest, zero
    rows, rows holding one value of the smallest magnitude among zeros, and (check=False, the GPU's
    path: no host read) rows with a NaN or an infinity, which get the poison scale and q = 0. q and
    s bit for bit."""
    import numpy as np

    x, _ = _draw_rows(seed)
    q, s = ref.quantize_activations(x, check=False)
    q_np, s_np = _quantize_numpy(x)
    assert np.array_equal(q.numpy(), q_np), seed
    assert np.array_equal(s.numpy().view(np.int32), s_np.view(np.int32)), seed


def test_quantize_generator_covers_its_space():
    drawn = set().union(*(_draw_rows(seed)[1] for seed in range(QUANTIZE_CASES)))
    assert drawn == {"torch.bfloat16", "torch.float16", "torch.float32", "k0", "k>0", "zero", "tiny", "nan", "inf"}


def _spy_fraction_rounding(monkeypatch):
    calls = []
    real = ref._round_fraction_to_bf16

    def spy(v):
        calls.append(v)
        return real(v)

    monkeypatch.setattr(ref, "_round_fraction_to_bf16", spy)
    return calls


def test_epilogue_exact_fallback_exact_midpoints(monkeypatch):
    """reference: hand-rounded values. 257, 259 and -257 lie exactly halfway between two
    bf16 values (spacing 2 in [256, 512)): ties to even give 256, 260, -256. Float64 sees
    these ties exactly, so they must go through the Fraction fallback (spied on)."""
    calls = _spy_fraction_rounding(monkeypatch)
    acc = torch.tensor([[257, 259, -257, 258]], dtype=torch.int32)
    got = ref.epilogue_exact(acc, torch.ones(1, 1), torch.ones(4, 1))
    assert got.tolist() == [[256.0, 260.0, -256.0, 258.0]]
    assert len(calls) == 3  # the three ties; 258 is a bf16 value, decided in float64


# (acc, s_a, s_w) whose exact product is (M * 2**r + d) * 2**-70 with d = -1 or +1: one unit
# of a 55- or 56-bit number away from a bf16 rounding midpoint M * 2**r (M odd, 9 bits).
# s_a and s_w are fp32 with full 24-bit significands (odd, in [2**23, 2**24)). Float64
# rounds a64 * s_a * s_w onto the midpoint itself, and half-to-even then picks the wrong
# neighbour; only the exact fallback gets them right. Found by factoring M * 2**r +- 1.
NEAR_MIDPOINT = [
    (129, 15744335 * 2.0**-30, 13131217 * 2.0**-40, 379 * 2**46 - 1),
    (291, 12940169 * 2.0**-30, 10801267 * 2.0**-40, 289 * 2**47 + 1),
]


@pytest.mark.parametrize("sign", [1, -1])
def test_epilogue_exact_fallback_near_midpoints_beyond_float64(monkeypatch, sign):
    """reference: Python Fractions rounded once to bf16 (ties to even), and the exact
    product checked against its construction."""
    calls = _spy_fraction_rounding(monkeypatch)
    n = len(NEAR_MIDPOINT)
    acc = torch.zeros(n, n, dtype=torch.int32)
    s_a = torch.tensor([[c[1]] for c in NEAR_MIDPOINT], dtype=torch.float32)
    s_w = torch.tensor([[c[2]] for c in NEAR_MIDPOINT], dtype=torch.float32)
    for i, (a, sa, sw, numer) in enumerate(NEAR_MIDPOINT):
        assert float(s_a[i, 0]) == sa and float(s_w[i, 0]) == sw  # exact in fp32
        exact = Fraction(a) * Fraction(sa) * Fraction(sw)
        assert exact == Fraction(numer, 2**70) and numer.bit_length() > 53
        acc[i, i] = sign * a
        acc[i, (i + 1) % n] = sign * 1000003  # an ordinary neighbour
    got = ref.epilogue_exact(acc, s_a, s_w)
    assert len(calls) >= n
    want_rounded_in_float64 = 0
    for i in range(n):
        for j in range(n):
            exact = Fraction(int(acc[i, j])) * Fraction(float(s_a[i, 0])) * Fraction(float(s_w[j, 0]))
            want = ref._round_fraction_to_bf16(exact)
            assert float(got[i, j]) == want, (i, j)
            if i == j:
                # Float64 alone (the fast path, without the fallback) would be one spacing off.
                v = torch.tensor(float(acc[i, j]), dtype=torch.float64) * float(s_a[i, 0]) * float(s_w[j, 0])
                _, e = torch.frexp(v)
                f64 = float(torch.ldexp(torch.round(torch.ldexp(v, 8 - e)), e - 8))
                want_rounded_in_float64 += f64 != want
    assert want_rounded_in_float64 == n


def _rn_significand(v: Fraction, bits: int) -> Fraction:
    """v rounded to `bits` significant bits, ties to even, with an unbounded exponent."""
    if v == 0:
        return v
    x = abs(v)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    spacing = Fraction(2) ** (e - bits + 1)
    return (1 if v > 0 else -1) * round(x / spacing) * spacing


def _quantize_by_fractions(x: torch.Tensor) -> list[list[int]]:
    """The quantize_activations contract on exact rationals: inv = 127 / absmax rounded to
    24 significant bits without overflow, q = clamp(rne(fp32(x * inv)))."""
    out = []
    for row in x.to(torch.float64).tolist():
        vals = [Fraction(v) for v in row]
        amax = max(abs(v) for v in vals)
        if amax == 0:
            out.append([0] * len(vals))
            continue
        inv = _rn_significand(Fraction(127) / amax, 24)
        out.append([max(-128, min(127, round(_rn_significand(v * inv, 24)))) for v in vals])
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_tiny_and_subnormal_rows(dtype):
    """reference: Python Fractions (the contract with an unbounded exponent for inv), and
    numpy float32 for s = fp32(absmax / 127), subnormal rounding included."""
    import numpy as np

    x = tiny_rows(dtype)
    q, s = ref.quantize_activations(x)
    assert q.tolist() == _quantize_by_fractions(x)
    xf = x.float().numpy()
    assert np.array_equal(s.numpy(), np.abs(xf).max(axis=1, keepdims=True) / np.float32(127))
    for i, row in enumerate(q.tolist()):
        if any(x[i].tolist()):  # every nonzero row keeps its full range, no NaN garbage
            assert max(abs(v) for v in row) == 127 and -128 not in row, (i, row)
    assert q[0].tolist()[:4] == [127, 0, -127, 64]  # the reviewer's row: 5e-38 is half of 1e-37 (tie -> 64)
    if dtype == torch.float32:
        assert float(s[-1]) == 0.0 and q[-1].abs().max() == 127  # s underflows, q still exact


def test_quantize_refuses_like_the_contract():
    """reference: none (error behaviour). Only 2-D finite bf16/fp16/fp32 is accepted;
    float64 1e300 is refused by dtype, not silently turned into inf."""
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        ref.quantize_activations(torch.full((2, 4), 1e300, dtype=torch.float64))
    with pytest.raises(TypeError):
        ref.quantize_activations(torch.ones(2, 4, dtype=torch.float64))
    with pytest.raises(TypeError):
        ref.quantize_activations(torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        ref.quantize_activations(torch.ones(2, 4, 1))
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.ones(2, 4, dtype=torch.bfloat16)
        x[1, 2] = bad
        with pytest.raises(ValueError, match="NaN or infinity"):
            ref.quantize_activations(x)


def test_bitwise_equal_every_element_size():
    """reference: torch.equal on integer views, and hand-made -0/+0 and NaN cases."""
    from requant.kernels.bf16 import bitwise_equal as beq

    i8 = torch.arange(15, dtype=torch.int8).reshape(3, 5)  # 1-byte elements, odd last dim
    assert beq(i8, i8.clone()) and not beq(i8, i8.flip(1))
    f64 = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(3, 5)
    assert beq(f64, f64.clone())
    assert not beq(f64, torch.nextafter(f64, torch.full_like(f64, 2.0)))
    assert not beq(torch.zeros(3, dtype=torch.float64), -torch.zeros(3, dtype=torch.float64))
    nan = torch.full((2, 3), float("nan"), dtype=torch.float64)
    assert beq(nan, nan.clone())
    assert not beq(i8, i8.to(torch.int16)) and not beq(i8, i8[:2])
    bf = torch.randn(4, 7).to(torch.bfloat16)
    assert beq(bf, bf.clone()) and not beq(bf, -bf)
    f32 = torch.randn(2, 3)
    assert beq(f32.t(), f32.t().contiguous())  # non-contiguous operand
