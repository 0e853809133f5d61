"""bfloat16 bit-level helpers: the rounding rules and the distance that every exactness
claim in requant is stated in.

Why bit-level: torch's float32 -> bfloat16 cast rounds to nearest even on CPU and GPU,
but Triton's CPU interpreter truncates, and an audit has to *name* the rounding it
checks. So the rules are written once here on the integer bits, and the kernels'
outputs are compared against them bit for bit.

Distances are measured on the monotone integer line of bf16 ("ordinal"): adjacent
finite bf16 values differ by exactly 1, and +0 and -0 share ordinal 0. One spacing
(one ULP) is therefore a distance of 1, whatever the binade.
"""

import torch

_SIGN = 0x8000
# An integer dtype of each element size, for comparing bits (bitwise_equal).
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fp32_bits(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"expected float32, got {x.dtype}")
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_to_bf16(bits16: torch.Tensor) -> torch.Tensor:
    # int64 holding 0..0xFFFF -> the bf16 with those bits.
    b = bits16.to(torch.int32)
    b = torch.where(b >= 0x8000, b - 0x10000, b)
    return b.to(torch.int16).view(torch.bfloat16)


def round_fp32_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16, round to nearest, ties to even (NaN stays NaN)."""
    u = _fp32_bits(x)
    lsb = (u >> 16) & 1
    rounded = (u + 0x7FFF + lsb) >> 16
    nan = torch.isnan(x)
    rounded = torch.where(nan, (u >> 16) | 0x40, rounded)
    return _bits_to_bf16(rounded & 0xFFFF)


def truncate_fp32_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 rounding toward zero (drop the low 16 bits)."""
    return _bits_to_bf16((_fp32_bits(x) >> 16) & 0xFFFF)


def bf16_bits(y: torch.Tensor) -> torch.Tensor:
    """The 16 bits of a bfloat16 tensor as int32 in 0..0xFFFF."""
    if y.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16, got {y.dtype}")
    return y.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def bf16_ordinal(y: torch.Tensor) -> torch.Tensor:
    """Position of each bf16 value on the monotone integer line (int32)."""
    b = bf16_bits(y)
    return torch.where(b >= _SIGN, _SIGN - b, b)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 spacings between two bf16 tensors of one shape (int64).

    NaN is not ordered: any NaN on either side gives a distance of 2**31 so that it
    can never pass as "within one spacing".
    """
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    d = (bf16_ordinal(a).to(torch.int64) - bf16_ordinal(b).to(torch.int64)).abs()
    nan = torch.isnan(a) | torch.isnan(b)
    return torch.where(nan, torch.full_like(d, 2**31), d)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype and the same bits everywhere (so -0 != +0, NaN == same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = _SAME_SIZE_INT.get(a.element_size())
    if view is None:  # e.g. complex128: compare the raw bytes of the flattened tensors
        return bool(
            torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
        )
    # An integer dtype of the same element size: the view keeps the shape (any last dim).
    return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))


def is_power_of_two(s: torch.Tensor) -> torch.Tensor:
    """Elementwise: is each finite positive value an exact power of two (normal or not)."""
    x = s.detach().to(torch.float64)
    mant, _ = torch.frexp(x)
    return torch.isfinite(x) & (x > 0) & (mant == 0.5)
