"""The two regimes a W8A8 checkpoint's quantized Linears run in, named and checked in one place.

    native  the checkpoint's own per-channel weight scales, as stored
    pow2    the nearest arm: each scale rounded to the nearest power of two and the int8 weights
            requantized to it, the bytes `requant convert --arm nearest` writes, built in memory

check_regime is the one check of a regime name: at the command line (--regime: UsageError naming
the option) and in requant.runtime.load_model (ValueError); what runs below them takes the name as
given. pow2_weights is the one build of a pow2 Linear, on whichever device its weight lives
(requant.scales.device.requantize_nearest: the converter's bytes, proved in
tests/requant/scales/test_device.py). Names only at import (no torch), like requant.scales.
"""

from __future__ import annotations

from requant.errors import UsageError

__all__ = ["NATIVE", "POW2", "REGIMES", "check_regime", "pow2_weights", "pow2_weights_many"]

NATIVE = "native"
POW2 = "pow2"
REGIMES = (NATIVE, POW2)


def check_regime(regime: str, option: str | None = None) -> str:
    """`regime` when it is one of REGIMES; otherwise UsageError naming `option` (a command's
    --regime) or, with no option, ValueError."""
    if regime in REGIMES:
        return regime
    if option is not None:
        raise UsageError(f"{option} must be one of {', '.join(REGIMES)}, got {regime!r}")
    raise ValueError(f"unknown regime {regime!r}; known: {', '.join(REGIMES)}")


def pow2_weights(q, scale):
    """(q' int8 on q's device, s' [out, 1] in scale's dtype on the host): the pow2 regime's
    Linear from the stored one, on any device (module docstring)."""
    from requant.scales.device import requantize_nearest  # torch: not at import

    return requantize_nearest(q, scale)


def pow2_weights_many(pairs):
    """[pow2_weights(q, s) for (q, s) in pairs], stacked where the weights allow (the same bits:
    requant.scales.device.requantize_nearest_many)."""
    from requant.scales.device import requantize_nearest_many  # torch: not at import

    return requantize_nearest_many(pairs)
