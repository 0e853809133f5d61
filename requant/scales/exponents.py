"""Power-of-two exponents of weight scales, computed from the float's bits, never through
a rounded log2.

    s = m * 2^E with m in [0.5, 1)            (frexp: exact in float64 for every bf16,
                                               fp16 and fp32 value)
    ceiling: e = E - 1 if m == 0.5 else E      (the smallest 2^e >= s)
    nearest: e = E if m*m >= 0.5 else E - 1    (the nearest in the log domain)

Why nearest is exact: log2(s) - (E - 1) = log2(2m) >= 1/2  <=>  m >= 2^-1/2  <=>  m*m >= 1/2.
m has at most 24 significant bits, so m*m (at most 48 bits) is exact in float64, and
m = 2^-1/2 exactly is impossible (it is irrational), so there is no tie to break.

2^e is exact in bf16 for -133 <= e <= 127 (subnormals included), in fp16 for
-24 <= e <= 15, in fp32 for -149 <= e <= 127. A power of two the scale's dtype cannot
hold is an error (pow2_scale) or, per channel, no candidate (pow2_candidates); it is never
rounded to something else.
"""

from __future__ import annotations

import numpy as np
import torch


def frexp(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m float64, E int64) with scale = m * 2^E, m in [0.5, 1); exact."""
    m, e = torch.frexp(scale.detach().to(torch.float64))
    return m, e.to(torch.int64)


def ceil_exponent(scale: torch.Tensor) -> torch.Tensor:
    """e = ceil(log2 s), exactly (int64, same shape)."""
    m, e = frexp(scale)
    return torch.where(m == 0.5, e - 1, e)


def nearest_exponent(scale: torch.Tensor) -> torch.Tensor:
    """e = the integer nearest to log2 s, exactly (int64, same shape)."""
    m, e = frexp(scale)
    return torch.where(m * m >= 0.5, e, e - 1)


def pow2_scale(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2^e in `dtype`, refusing any e the dtype cannot hold exactly."""
    exact = torch.ldexp(torch.ones(e.shape, dtype=torch.float64), e)
    out = exact.to(dtype)
    if not bool((out.to(torch.float64) == exact).all()):
        bad = int(e[out.to(torch.float64) != exact].reshape(-1)[0])
        raise ValueError(f"2^{bad} is not representable in {dtype}")
    return out


def pow2_candidates(e: torch.Tensor, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(2^e as float64 [n], ok [n] bool): per element, whether `dtype` holds 2^e exactly.
    Where it does not, the float64 value is replaced by 1.0 (a harmless placeholder: such a
    row is no candidate and must be given infinite error by the caller)."""
    exact = torch.ldexp(torch.ones(e.shape, dtype=torch.float64), e).reshape(-1)
    ok = exact.to(dtype).to(torch.float64) == exact
    return torch.where(ok, exact, torch.ones_like(exact)).numpy(), ok.numpy()


def shift_histogram(e_new: torch.Tensor, scale: torch.Tensor) -> dict[int, int]:
    """{e' - ceil(log2 s): number of channels}: how far each new exponent moved."""
    shifts = (e_new - ceil_exponent(scale)).reshape(-1)
    vals, counts = torch.unique(shifts, return_counts=True)
    return {int(v): int(c) for v, c in zip(vals, counts)}
