"""Scale arms: how each per-channel weight scale becomes (or does not become) a power of two.

Why powers of two: CUTLASS computes s_a * (s_w * acc) and Triton (s_a * acc) * s_w in
fp32. Multiplying by a power of two is exact (barring under/overflow), so with s_w = 2^e
both orders round only once, at the same place, and give the same bits.

The arms and their numerics: docs/checkpoints.md#arms---arm.
"""

from __future__ import annotations

from requant.scales import ARMS, SERVABLE
from requant.scales.exponents import (
    ceil_exponent,
    frexp,
    nearest_exponent,
    pow2_candidates,
    pow2_scale,
    shift_histogram,
)
from requant.scales.from_source import quantize_from_source, rtn_quantize
from requant.scales.requantizer import (
    BLOCK_ELEMENTS,
    MSE_OFFSETS,
    SCALE_DTYPES,
    LinearStats,
    Requantizer,
    check_inputs,
    requantize,
    requantize_with_stats,
)

__all__ = [
    "ARMS",
    "SERVABLE",
    "SCALE_DTYPES",
    "MSE_OFFSETS",
    "BLOCK_ELEMENTS",
    "LinearStats",
    "Requantizer",
    "check_inputs",
    "requantize",
    "requantize_with_stats",
    "frexp",
    "ceil_exponent",
    "nearest_exponent",
    "pow2_scale",
    "pow2_candidates",
    "shift_histogram",
    "quantize_from_source",
    "rtn_quantize",
]
