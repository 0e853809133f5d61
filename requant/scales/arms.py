"""Scale arms: how each per-channel weight scale becomes (or does not become) a power of two.

Why powers of two: CUTLASS computes s_a * (s_w * acc) and Triton (s_a * acc) * s_w in
fp32. Multiplying by a power of two is exact (barring under/overflow), so with s_w = 2^e
both orders round only once, at the same place, and give the same bits.

Arms:
  unconstrained  scales and weights kept (the reader/writer's round-trip proof)
  nearest        s' = 2^nearest(log2 s), weights requantized
  ceiling        s' = 2^ceil(log2 s), weights requantized, never clips
  mse            per output channel, the power of two near ceil(log2 s) that minimises
                 the channel's squared reconstruction error
  probe          s' = nearest power of two, weights NOT requantized. The flawed
                 construction that once reported +157% perplexity; an ablation, not servable.

Pure functions on one Linear at a time, in three modules (this one is their public face;
every name below stays importable from requant.scales.arms):
  requant.scales.exponents    exponents from the float's bits (frexp, ceil/nearest exponent, 2^e
                       in the scale's dtype): the derivations of exactness
  requant.scales.requantizer  the arms on int8 weights (Requantizer, requantize,
                       requantize_with_stats, LinearStats): q' = clamp(rint(q * s / s'))
                       computed exactly, and the statistics
  requant.scales.from_source  the arms on the original float weights (quantize_from_source) and
                       llm-compressor's RTN (rtn_quantize) that they start from
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
