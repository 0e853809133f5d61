"""The numbers under requant.runtime.sampling, shared with its batched chooser (sampling_batch):
the request's random integer and exp/log from + * / only, the same bits on every machine.
Definitions and proofs: requant/runtime/sampling.py's module docstring, docs/runtime.md."""

from __future__ import annotations

import hashlib
import math

import torch

WEIGHT_BITS = 40
EXP_CUTOFF = -64.0  # exp64(x) = 0 below: exp(-64) < 2**-92, far under any weight or sum resolution
_DOMAIN = b"requant-sample-v1"
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # fdlibm's split of ln 2: k * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
_EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))  # Taylor, degree 13, Horner order
_LOG_COEFFS = tuple(1.0 / n for n in range(23, 0, -2))  # 2 atanh(s) series: 1/23 ... 1/1


def uniform_int(seed: int, key: str, position: int) -> int:
    """The request's random integer in [0, 2**128) at absolute position `position`."""
    kb = key.encode("utf-8")
    msg = _DOMAIN + seed.to_bytes(8, "little") + len(kb).to_bytes(8, "little") + kb + position.to_bytes(8, "little")
    return int.from_bytes(hashlib.sha256(msg).digest()[:16], "big")


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


# Below these, a term is 0 anyway (exp64 is within an ulp of exp): exp(-28) < 2**-40 (a weight),
# exp(-56) < 2**-80 (a term of the logprob's sum). Skipping them is only faster.
WEIGHT_FLOOR = -28.0
SUM_FLOOR = -56.0
