"""The exact oracle itself (kernels.reference): accumulator, the two epilogue orders,
the exact rounding, operand checks. Reference implementations named per test."""

from fractions import Fraction

import pytest
import torch

from kernels import reference as ref
from kernels.bf16 import bitwise_equal, round_fp32_to_bf16, ulp_distance
from tests.kernels.operands import random_operands as _operands


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
    """reference: Python floats emulating fp32 (numpy-free): IEEE divisions, half-even rounding."""
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
