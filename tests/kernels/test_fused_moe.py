"""kernels/fused_moe.py: vLLM's int8 fused-MoE arithmetic (reference-vllm-moe-order).

Reference: exact rationals (Fractions), each fp32 operation of the kernel restated as the exact
result rounded once to 24 significant bits (subnormals included), the bf16 conversions to 8; the
accumulator a Python integer sum. Cases from a seeded generator over shapes (M, N or K of 0 and 1
included), scales (powers of two and not, across the exponent range, subnormal fp32 products),
route weights (0, 1, tiny, in (0, 1)) and int8 extremes (-128, 127).
"""

import random
from fractions import Fraction

import pytest
import torch

from requant import kernels
from requant.kernels.bf16 import bitwise_equal, round_fp32_to_bf16
from requant.kernels.epilogue import int_mm
from requant.kernels.fused_moe import MOE_SUM_BF16_MAX_K, VLLM_MOE, down_vllm, moe_sum_vllm, scaled_mm_vllm_moe


def _round(v: Fraction, bits: int) -> Fraction:
    """v rounded once to `bits` significant bits, ties to even, exponents down to fp32's/bf16's
    subnormal range (both have minimum normal exponent -126); no overflow in these cases."""
    if v == 0:
        return Fraction(0)
    sign, x = (-1 if v < 0 else 1), abs(v)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    spacing = Fraction(2) ** (max(e, -126) - (bits - 1))
    return sign * round(x / spacing) * spacing


def f32(v):
    return _round(Fraction(v), 24)


def bf16(v):
    return _round(Fraction(v), 8)


def _scale(rng: random.Random, pow2: bool) -> float:
    e = rng.choice([rng.randint(-20, 4), rng.randint(-120, -100)])  # the low ones make subnormal products
    if pow2:
        return 2.0**e
    return float(torch.tensor(rng.uniform(1, 2) * 2.0**e, dtype=torch.float32))


def _route(rng: random.Random) -> float:
    r = rng.choice([0.0, 1.0, 2.0**-30, rng.random(), rng.random()])
    return float(torch.tensor(r, dtype=torch.float32))


def _case(rng: random.Random, pow2: bool):
    m, n, k = rng.choice([0, 1, rng.randint(2, 6)]), rng.choice([1, rng.randint(2, 5)]), rng.choice([0, 1, 33, 300])
    extreme = rng.random() < 0.25
    a = torch.randint(-127, 128, (m, k), generator=torch.Generator().manual_seed(rng.randint(0, 2**31)))
    w = torch.randint(-128, 128, (n, k), generator=torch.Generator().manual_seed(rng.randint(0, 2**31)))
    if extreme:  # the largest |acc|: every product -128 * -127
        a, w = torch.full((m, k), -127), torch.full((n, k), -128)
    s_a = torch.tensor([[_scale(rng, False)] for _ in range(m)], dtype=torch.float32).reshape(m, 1)
    s_w = torch.tensor([[_scale(rng, pow2)] for _ in range(n)], dtype=torch.float32).reshape(n, 1)
    r = torch.tensor([[_route(rng)] for _ in range(m)], dtype=torch.float32).reshape(m, 1)
    return a.to(torch.int8), w.to(torch.int8), s_a, s_w, r


def _acc(a, w) -> list[list[int]]:
    al, wl = a.tolist(), w.tolist()
    return [[sum(x * y for x, y in zip(ra, rw)) for rw in wl] for ra in al]


def _tensor(rows, m, n, signs=None) -> torch.Tensor:
    """bf16 [m, n] of exact values; a zero takes the sign of its entry in `signs` (the accumulator:
    positive scales and weights keep it through IEEE products, underflow included)."""
    signs = signs or [[1] * n for _ in range(m)]
    vals = [[float(v) if v != 0 else (-0.0 if sg < 0 else 0.0) for v, sg in zip(r, sr)] for r, sr in zip(rows, signs)]
    return torch.tensor(vals, dtype=torch.float32).reshape(m, n).to(torch.bfloat16)


CASES = 160


@pytest.mark.parametrize("pow2", [False, True])
def test_down_is_the_kernels_left_to_right_epilogue(pow2):
    """bf16(((acc * r) * s_a) * s_w), each product rounded to fp32, against the rational restatement."""
    rng = random.Random(41 + pow2)
    for _ in range(CASES):
        a, w, s_a, s_w, r = _case(rng, pow2)
        m, n = a.shape[0], w.shape[0]
        want = [
            [
                bf16(
                    f32(
                        f32(f32(acc * Fraction(r[i, 0].item())) * Fraction(s_a[i, 0].item()))
                        * Fraction(s_w[j, 0].item())
                    )
                )
                for j, acc in enumerate(row)
            ]
            for i, row in enumerate(_acc(a, w))
        ]
        got = down_vllm(int_mm(a, w), s_a, s_w, r)
        assert got.dtype == torch.bfloat16 and bitwise_equal(got, _tensor(want, m, n, _acc(a, w))), (a.shape, w.shape)


def test_plain_gemm_is_the_triton_order():
    """Without a routed weight (gate/up): bf16(fp32(acc * s_a) * s_w), via the backend's name too."""
    rng = random.Random(7)
    for _ in range(CASES):
        a, w, s_a, s_w, _ = _case(rng, rng.random() < 0.5)
        m, n = a.shape[0], w.shape[0]
        want = [
            [bf16(f32(f32(acc * Fraction(s_a[i, 0].item())) * Fraction(s_w[j, 0].item()))) for j, acc in enumerate(row)]
            for i, row in enumerate(_acc(a, w))
        ]
        for got in (scaled_mm_vllm_moe(a, w, s_a, s_w), kernels.scaled_mm(a, w, s_a, s_w, backend=VLLM_MOE)):
            assert bitwise_equal(got, _tensor(want, m, n, _acc(a, w)))
    assert kernels.emulation_of(VLLM_MOE) == "reference-triton-order"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8])
def test_moe_sum(k):
    """k <= 4: a bf16 fold from 0 in slot order (each add rounded to bf16); wider: an fp32 fold rounded once."""
    g = torch.Generator().manual_seed(k)
    for t in (0, 1, 9):
        mag = torch.exp2(torch.randint(-30, 10, (t, k, 6), generator=g).to(torch.float32))
        z = (torch.randn(t, k, 6, generator=g) * mag).to(torch.bfloat16)
        z[:, :, 0] = 0  # degenerate columns: all zero, and exact cancellation
        if k > 1:
            z[:, 1, 1] = -z[:, 0, 1]
        want = []
        for row in z.to(torch.float32).tolist():
            out = []
            for col in zip(*row):
                x = Fraction(0)
                for v in col:
                    x = bf16(x + Fraction(v)) if k <= MOE_SUM_BF16_MAX_K else f32(x + Fraction(v))
                out.append(bf16(x))
            want.append(out)
        assert bitwise_equal(moe_sum_vllm(z), _tensor(want, t, 6))


def test_pow2_frees_the_weight_scale():
    """Under pow2 weight scales s_w may enter vLLM's down epilogue at any step: a product by a power of
    two is exact without under/overflow (the cases' scales are kept out of the subnormal range)."""
    rng = random.Random(3)
    for _ in range(CASES):
        a, w, s_a, s_w, r = _case(rng, True)
        s_a, s_w = s_a.clamp(min=2.0**-20), s_w.clamp(min=2.0**-20)
        acc, sw = int_mm(a, w).to(torch.float32), s_w.reshape(1, -1)
        got = down_vllm(int_mm(a, w), s_a, s_w, r)
        assert bitwise_equal(got, round_fp32_to_bf16(((acc * sw) * r) * s_a))
        assert bitwise_equal(got, round_fp32_to_bf16(((acc * r) * sw) * s_a))
