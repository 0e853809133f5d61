"""requant.kernels.bf16, against independent references. Every bitwise claim in requant
rests on these helpers, so none of them is its own reference here:

  * round / truncate: integer arithmetic on the fp32 bit patterns written differently from
    the implementation (tests/kernels/bf16_ref.py: an explicit comparison of the dropped
    half-word with the tie 0x8000, in numpy uint64, instead of the implementation's
    add-0x7FFF-plus-lsb trick in torch),
    cross-checked with torch's own float32 -> bfloat16 cast (round half to even, a separate
    implementation in C++) on every non-NaN pattern, plus hand-derived IEEE test vectors
    for every tie and boundary class;
  * bf16_ordinal / ulp_distance: the rank of each value among all bf16 values sorted by
    value (-0 and +0 one rank), from Python floats: a definition that uses no bits;
  * is_power_of_two: Python's float.as_integer_ratio (a power of two is 2^k / 1 or 1 / 2^k);
  * bitwise_equal: the raw bytes, compared as Python bytes.
Sweeps: every fp32 pattern with a stride of 1031 (odd, so the low half-words cycle through
all 65536 values), plus, for every high half-word, the low half-words around the tie and
the ends (0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF).
"""

import math
import struct

import numpy as np
import pytest
import torch

from requant.kernels.bf16 import (
    bf16_bits,
    bf16_ordinal,
    bitwise_equal,
    is_power_of_two,
    round_fp32_to_bf16,
    truncate_fp32_to_bf16,
    ulp_distance,
)
from tests.kernels.bf16_ref import is_nan_bits, ref_round, ref_truncate

STRIDE = 1031  # odd: coprime with 2^16, so the low half-words of the sweep take every value
NEIGHBOURHOOD = (0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF)
CHUNK = 1 << 21


def _patterns():
    """Chunks of uint32 fp32 bit patterns: the strided sweep, then the tie neighbourhood."""
    for start in range(0, 1 << 32, CHUNK * STRIDE):
        stop = min(1 << 32, start + CHUNK * STRIDE)
        yield np.arange(start, stop, STRIDE, dtype=np.uint64).astype(np.uint32)
    hi = np.arange(1 << 16, dtype=np.uint64) << 16
    yield (hi[:, None] | np.array(NEIGHBOURHOOD, dtype=np.uint64)[None, :]).reshape(-1).astype(np.uint32)


def _to_torch_f32(u: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(u.view(np.int32).copy()).view(torch.float32)


def _bits16(y: torch.Tensor) -> np.ndarray:
    return y.view(torch.int16).numpy().view(np.uint16)


def test_round_and_truncate_sweep():
    """Every pattern of the sweep: round == ref_round, truncate == the high half-word
    (for NaNs whose payload sits only in the low half-word that is +-inf: pure truncation,
    as documented), and round == torch's own cast wherever the input is not NaN."""
    n = 0
    for u in _patterns():
        x = _to_torch_f32(u)
        got = _bits16(round_fp32_to_bf16(x))
        assert np.array_equal(got, ref_round(u)), _first_bad(u, got, ref_round(u))
        trunc = _bits16(truncate_fp32_to_bf16(x))
        assert np.array_equal(trunc, ref_truncate(u)), _first_bad(u, trunc, ref_truncate(u))
        keep = ~is_nan_bits(u)
        cast = _bits16(x[torch.from_numpy(keep)].to(torch.bfloat16))
        assert np.array_equal(got[keep], cast), _first_bad(u[keep], got[keep], cast)
        n += u.size
    assert n > (1 << 32) // STRIDE + 65536 * len(NEIGHBOURHOOD) - 2


def _first_bad(u, got, want):
    i = int(np.flatnonzero(got != want)[0])
    return f"fp32 {int(u[i]):#010x}: got {int(got[i]):#06x}, want {int(want[i]):#06x}"


# (fp32 bits, rounded bf16 bits, truncated bf16 bits), derived by hand from IEEE 754:
# bf16 keeps the high half-word; the low half-word decides the rounding.
VECTORS = [
    (0x3F800000, 0x3F80, 0x3F80),  # 1.0: exact
    (0x3F808000, 0x3F80, 0x3F80),  # tie, kept half-word even (0x3F80): stays
    (0x3F818000, 0x3F82, 0x3F81),  # tie, kept half-word odd (0x3F81): up to even
    (0x3F807FFF, 0x3F80, 0x3F80),  # just below the tie: down
    (0x3F808001, 0x3F81, 0x3F80),  # just above the tie: up
    (0xBF808001, 0xBF81, 0xBF80),  # negative, just above the tie: away from zero
    (0xBF818000, 0xBF82, 0xBF81),  # negative tie, odd: to even (away from zero)
    (0x3FFF8000, 0x4000, 0x3FFF),  # tie at the top of a binade: carry into the exponent
    (0x7F7F0000, 0x7F7F, 0x7F7F),  # the largest finite bf16
    (0x7F7F7FFF, 0x7F7F, 0x7F7F),  # below the tie above it: stays finite
    (0x7F7F8000, 0x7F80, 0x7F7F),  # tie with an odd half-word: rounds to +inf
    (0x7F7FFFFF, 0x7F80, 0x7F7F),  # the largest finite fp32: overflows to +inf
    (0xFF7FFFFF, 0xFF80, 0xFF7F),  # and to -inf
    (0x7F800000, 0x7F80, 0x7F80),  # +inf
    (0xFF800000, 0xFF80, 0xFF80),  # -inf
    (0x00000000, 0x0000, 0x0000),  # +0
    (0x80000000, 0x8000, 0x8000),  # -0 keeps its sign
    (0x00000001, 0x0000, 0x0000),  # the smallest subnormal: rounds to +0
    (0x80000001, 0x8000, 0x8000),  # ... and to -0
    (0x00008000, 0x0000, 0x0000),  # subnormal tie, even: to zero
    (0x00018000, 0x0002, 0x0001),  # subnormal tie, odd: up
    (0x00010000, 0x0001, 0x0001),  # the smallest bf16 subnormal, exact
    (0x007FFFFF, 0x0080, 0x007F),  # the largest subnormal rounds up to the smallest normal
    (0x7FC00000, 0x7FC0, 0x7FC0),  # quiet NaN
    (0xFFC00001, 0xFFC0, 0xFFC0),  # negative quiet NaN with a low payload
    (0x7FA00000, 0x7FE0, 0x7FA0),  # signalling NaN, high payload: kept, quieted
    (0x7F800001, 0x7FC0, 0x7F80),  # signalling NaN, payload only in the low bits: stays NaN (truncation: inf)
    (0x7FFFFFFF, 0x7FFF, 0x7FFF),  # all-ones NaN: no carry out of the half-word
]


@pytest.mark.parametrize("bits,rounded,truncated", VECTORS, ids=[f"{b:#010x}" for b, _, _ in VECTORS])
def test_tie_and_boundary_vectors(bits, rounded, truncated):
    x = _to_torch_f32(np.array([bits], dtype=np.uint32))
    assert int(_bits16(round_fp32_to_bf16(x))[0]) == rounded
    assert int(_bits16(truncate_fp32_to_bf16(x))[0]) == truncated
    assert int(ref_round(np.array([bits], dtype=np.uint32))[0]) == rounded  # the reference agrees with IEEE too


def test_round_is_nearest_by_value():
    """Value-domain check on a seeded sample of finite patterns whose rounding stays finite:
    the result is a bf16 no farther from x than the other neighbour, and at a tie the one
    with an even last bit (exact float64 arithmetic: fp32 and bf16 values and their
    differences are exact there)."""
    g = np.random.default_rng(0)
    u = g.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    u = u[((u.astype(np.uint64) >> 23) & 0xFF) != 0xFF]
    u = u[(u.astype(np.uint64) & 0x7FFFFFFF) < 0x7F7F8000]  # below the overflow threshold
    x = _to_torch_f32(u)
    got = _bits16(round_fp32_to_bf16(x)).astype(np.uint64)
    down = u.astype(np.uint64) >> 16  # truncation toward zero: one neighbour
    up = down + 1  # the next one away from zero

    def as64(h):
        return _to_torch_f32((h << 16).astype(np.uint32)).double().numpy()

    xv, dv, uv = x.double().numpy(), as64(down), as64(up)
    dd, du = np.abs(xv - dv), np.abs(uv - xv)
    want = np.where(dd < du, down, np.where(du < dd, up, np.where(down % 2 == 0, down, up)))
    assert np.array_equal(got, want)


def _all_bf16() -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _value_ranks():
    """{float value: rank} over every non-NaN bf16 value sorted by value; -0 == +0."""
    vals = sorted({float(v) for v in _all_bf16().float().tolist() if not math.isnan(v)})
    return {v: i for i, v in enumerate(vals)}


def test_bf16_bits_every_pattern():
    y = _all_bf16()
    want = np.arange(-(1 << 15), 1 << 15, dtype=np.int64) & 0xFFFF
    assert np.array_equal(bf16_bits(y).numpy().astype(np.int64), want)
    with pytest.raises(TypeError):
        bf16_bits(torch.zeros(2))


def test_ordinal_is_the_rank_by_value():
    """Every non-NaN bf16: ordinal == rank among all bf16 values - rank of zero, so
    adjacent values differ by exactly one, +-0 share 0, and +-inf sit one past the largest
    finite values."""
    ranks = _value_ranks()
    y = _all_bf16()
    vals = y.float().tolist()
    ords = bf16_ordinal(y).tolist()
    zero = ranks[0.0]
    checked = 0
    for v, o in zip(vals, ords):
        if not math.isnan(v):
            assert o == ranks[v] - zero, v
            checked += 1
    assert (
        checked == 65536 - 2 * 127
    )  # every pattern but the NaNs (exponent all ones, 127 non-zero mantissas, two signs)


def test_ulp_distance_against_ranks():
    """Seeded pairs over all bf16 patterns (NaNs included) and the boundary pairs:
    |rank(a) - rank(b)|, or 2^31 when either side is NaN."""
    ranks = _value_ranks()
    y = _all_bf16()
    g = torch.Generator().manual_seed(0)
    ia = torch.randint(0, y.numel(), (100_000,), generator=g)
    ib = torch.randint(0, y.numel(), (100_000,), generator=g)
    a, b = y[ia], y[ib]
    d = ulp_distance(a, b).tolist()
    for va, vb, dist in zip(a.float().tolist(), b.float().tolist(), d):
        if math.isnan(va) or math.isnan(vb):
            assert dist == 2**31
        else:
            assert dist == abs(ranks[va] - ranks[vb]), (va, vb)
    pairs = [
        (float("inf"), 3.3895313892515355e38, 1),
        (0.0, -0.0, 0),
        (2.0**-133, -(2.0**-133), 2),
        (1.0, 1.0078125, 1),
        (1.0, 0.99609375, 1),
        (-1.0, 1.0, 2 * 0x3F80),
    ]
    for x1, x2, want in pairs:
        t1, t2 = torch.tensor([x1]).to(torch.bfloat16), torch.tensor([x2]).to(torch.bfloat16)
        assert float(t1) == x1 and float(t2) == x2  # the inputs are exact bf16 values
        assert int(ulp_distance(t1, t2)) == want == abs(ranks[x1] - ranks[x2]), (x1, x2)
    with pytest.raises(ValueError):
        ulp_distance(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16))


def _ref_pow2(x: float) -> bool:
    if not math.isfinite(x) or x <= 0:
        return False
    n, d = x.as_integer_ratio()
    return (n == 1 and d & (d - 1) == 0) or (d == 1 and n & (n - 1) == 0)


def test_is_power_of_two_every_bf16_and_fp16():
    for dtype in (torch.bfloat16, torch.float16):
        y = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        got = is_power_of_two(y).tolist()
        want = [_ref_pow2(v) for v in y.double().tolist()]
        assert got == want, dtype
        assert sum(want) == (254 + 7 if dtype == torch.bfloat16 else 30 + 10)  # normal exponents + subnormal powers


def test_is_power_of_two_fp32_and_fp64():
    u = np.arange(0, 1 << 32, 40_961, dtype=np.uint64).astype(np.uint32)
    extra = np.array(
        [0x00000001, 0x00400000, 0x00800000, 0x7F000000, 0x7F800000, 0x3F800000, 0x3F800001, 0xBF800000],
        dtype=np.uint32,
    )
    x = _to_torch_f32(np.concatenate([u, extra]))
    assert is_power_of_two(x).tolist() == [_ref_pow2(v) for v in x.double().tolist()]
    f64 = torch.tensor(
        [
            5e-324,
            2.0**-1074,
            2.0**-1022,
            2.0**1023,
            1.7976931348623157e308,
            0.5,
            0.75,
            3.0,
            -2.0,
            0.0,
            float("inf"),
            float("nan"),
        ],
        dtype=torch.float64,
    )
    assert is_power_of_two(f64).tolist() == [_ref_pow2(v) for v in f64.tolist()]
    assert is_power_of_two(f64).tolist() == [
        True,
        True,
        True,
        True,
        False,
        True,
        False,
        False,
        False,
        False,
        False,
        False,
    ]


def _raw(t: torch.Tensor) -> bytes:
    c = t.contiguous()
    return bytes(c.reshape(-1).view(torch.uint8).numpy().tobytes()) if c.numel() else b""


def test_bitwise_equal_is_the_raw_bytes():
    """Reference: dtype, shape and the raw bytes compared as Python bytes."""

    def ref(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and _raw(a) == _raw(b)

    nan_a = torch.tensor([0x7FC0], dtype=torch.int16).view(torch.bfloat16)
    nan_b = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)
    z = torch.zeros(1, dtype=torch.bfloat16)
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cases = [
        (z, -z),  # +0 vs -0: equal values, different bits
        (nan_a, nan_a.clone()),  # the same NaN: equal bits
        (nan_a, nan_b),  # NaN payloads differ
        (z, torch.zeros(1, dtype=torch.float16)),  # dtype differs, same bits
        (m, m.reshape(4, 3)),  # shape differs, same bytes
        (m.t(), m.t().contiguous()),  # non-contiguous view vs copy
        (m, m.clone()),
        (torch.tensor([1 + 2j], dtype=torch.complex128), torch.tensor([1 + 2j], dtype=torch.complex128)),
        (torch.tensor([1 + 2j], dtype=torch.complex128), torch.tensor([1 - 2j], dtype=torch.complex128)),
        (torch.tensor([True, False]), torch.tensor([True, True])),
        (torch.empty(0, 3), torch.empty(0, 3)),
        (torch.tensor([-128], dtype=torch.int8), torch.tensor([128], dtype=torch.uint8)),
        (torch.tensor([2.0**-1074], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)),
    ]
    results = [bitwise_equal(a, b) for a, b in cases]
    assert results == [ref(a, b) for a, b in cases]
    assert results == [False, True, False, False, False, True, True, True, False, False, True, False, False]
    assert struct.pack("<e", 0.0) != struct.pack("<e", -0.0)  # the premise of the first case


def test_round_refuses_other_dtypes():
    with pytest.raises(TypeError):
        round_fp32_to_bf16(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError):
        truncate_fp32_to_bf16(torch.zeros(2, dtype=torch.bfloat16))
