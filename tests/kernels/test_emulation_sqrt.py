"""kernels.emulation.sqrt_rn: the IEEE square root (rounded once to nearest) whatever torch's CPU
sqrt does. Independent references: numpy's sqrt (IEEE 754 requires it correctly rounded) and, for the
case that exposed torch's, the exact midpoint test in Fractions."""

from fractions import Fraction

import numpy as np
import torch

from requant.kernels.emulation import sqrt_rn


def test_sqrt_rn_is_the_correctly_rounded_square_root():
    g = torch.Generator().manual_seed(3)
    x = torch.cat(
        [
            torch.rand(1_000_000, generator=g) * 4 + 0.01,
            torch.rand(100_000, generator=g) * 1e-38,  # subnormal and tiny normal inputs
            torch.rand(100_000, generator=g) * 3e38,
            torch.tensor([0.0, 1e-45, 1.0, 2.0, 3.4028235e38]),
        ]
    )
    got = sqrt_rn(x).view(torch.int32).numpy()
    want = np.sqrt(x.numpy()).view(np.int32)
    assert np.array_equal(got, want)


def test_the_input_that_torch_rounds_wrong_here():
    # var + eps of the RMSNorm row that made a GPU record diverge on CI's CPU before sqrt_rn
    v = np.float32(1.640993595123291)
    got = int(sqrt_rn(torch.tensor([v])).view(torch.int32)[0])
    lo, hi = np.int32(got).view(np.float32), np.int32(got + 1).view(np.float32)
    below = np.int32(got - 1).view(np.float32)
    # got is the nearest: the midpoints around it bracket v exactly
    assert (Fraction(float(below)) + Fraction(float(lo))) ** 2 / 4 < Fraction(float(v))
    assert (Fraction(float(lo)) + Fraction(float(hi))) ** 2 / 4 > Fraction(float(v))
    assert got == 1067710522


def test_sqrt_rn_keeps_the_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), float("nan"), -1.0])
    y = sqrt_rn(x)
    assert y[0].item() == 0.0 and torch.signbit(y[1]) and y[2].item() == float("inf")
    assert torch.isnan(y[3]) and torch.isnan(y[4])
