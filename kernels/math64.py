"""exp and log in float64 from + * / only: the same bits on every machine (no libm). The sampler
(requant.runtime.sampling) weighs tokens with them and the portable RoPE tables
(kernels/portable.py) build their frequencies with them. Proofs: requant/runtime/sampling.py's
module docstring, docs/runtime.md; tests/requant/runtime/test_sampling.py checks them against math."""

from __future__ import annotations

import math

import torch

__all__ = ["EXP_CUTOFF", "exp64", "log64"]

EXP_CUTOFF = -64.0  # exp64(x) = 0 below: exp(-64) < 2**-92, far under any weight or sum resolution
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # fdlibm's split of ln 2: k * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
_EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))  # Taylor, degree 13, Horner order
_LOG_COEFFS = tuple(1.0 / n for n in range(23, 0, -2))  # 2 atanh(s) series: 1/23 ... 1/1


def exp64(x: torch.Tensor) -> torch.Tensor:
    """exp of float64 x <= 0 from + and * only (Cody-Waite reduction by ln 2, Taylor degree 13,
    exact scaling by 2**k), 0 below EXP_CUTOFF: each op is one correctly rounded IEEE operation
    in its own torch call (nothing fused), so the bits are the same on every machine."""
    x = x.to(torch.float64)
    # in place where it can be (fewer large allocations): each op is still one rounded IEEE
    # operation per element, in the order round(clamp(x) * 1/ln2), (x - k*hi) - k*lo, Horner
    k = torch.clamp(x, min=EXP_CUTOFF).mul_(_INV_LN2).round_()
    t = torch.mul(k, _LN2_HI)
    r = torch.sub(x, t)
    r.sub_(torch.mul(k, _LN2_LO, out=t))
    p = t.fill_(_EXP_COEFFS[0])
    for c in _EXP_COEFFS[1:]:
        p.mul_(r).add_(c)
    p.mul_(k.to(torch.int64).add_(1023).bitwise_left_shift_(52).view(torch.float64))  # 2**k, exactly
    return p.masked_fill_(x < EXP_CUTOFF, 0.0)


def log64(z: float) -> float:
    """log of a float64 z > 0 from + * / only (frexp, then 2 atanh((m-1)/(m+1)) to s**23)."""
    m, e = math.frexp(z)
    if m < 0.7071067811865476:
        m, e = m * 2.0, e - 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    q = 0.0
    for c in _LOG_COEFFS:
        q = q * s2 + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * q)
