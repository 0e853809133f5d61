"""Per-layer comparison of the two real backends on the same captured operands.

This is fact (1) of the audit: does backend A return the same bits as backend B at every
quantized Linear, on real activations, under the checkpoint's own scales (native) and under
their power-of-two requantization (pow2)? Distances are bf16 spacings on the monotone
integer line (kernels.bf16.ulp_distance); equality is bit equality (kernels.bf16.bitwise_equal,
so -0 and +0 differ).
"""

from __future__ import annotations

import torch

from requant.kernels.bf16 import bitwise_equal, ulp_distance
from requant.regime import REGIMES


def compare_layer(name: str, regime: str, y_a: torch.Tensor, y_b: torch.Tensor, shape: tuple[int, int, int]) -> dict:
    """One per_layer row: bitwise_equal, mismatches (elements whose bits differ), max_ulp."""
    equal = bitwise_equal(y_a, y_b)
    if equal or y_a.numel() == 0:
        mismatches, max_ulp = 0, 0
    else:
        mismatches = int((y_a.view(torch.int16) != y_b.view(torch.int16)).sum())
        max_ulp = int(ulp_distance(y_a, y_b).max())
    return layer_row(name, regime, equal, mismatches, max_ulp, shape)


def layer_row(name: str, regime: str, equal: bool, mismatches: int, max_ulp: int, shape) -> dict:
    """The per_layer row from its figures (compare_layer's, or audit/batched.py's)."""
    m, k, n = shape
    return {
        "name": name,
        "regime": regime,
        "bitwise_equal": equal,
        "mismatches": mismatches,
        "max_ulp": max_ulp,
        "elements": m * n,
        "m": m,
        "k": k,
        "n": n,
    }


def summarize_layers(rows: list[dict], native_is_pow2: bool = False) -> dict:
    """Per regime: layers bitwise equal / layers, total mismatching elements, worst distance,
    and the one-line summary ("pow2: 28/28 layers bitwise equal; native: 3/28"). When every
    native scale is already a power of two, native and pow2 are the same operands, so the
    native figure is no finding and the line says so instead."""
    out = {}
    for regime in REGIMES:
        sel = [r for r in rows if r["regime"] == regime]
        out[regime] = {
            "layers": len(sel),
            "bitwise_equal": sum(r["bitwise_equal"] for r in sel),
            "mismatches": sum(r["mismatches"] for r in sel),
            "elements": sum(r["elements"] for r in sel),
            "max_ulp": max((r["max_ulp"] for r in sel), default=0),
        }
    if native_is_pow2:
        p = out["pow2"]
        out["line"] = (
            f"pow2: {p['bitwise_equal']}/{p['layers']} layers bitwise equal; "
            "native scales are already powers of two: native = pow2"
        )
        return out
    out["line"] = "; ".join(
        f"{regime}: {out[regime]['bitwise_equal']}/{out[regime]['layers']} layers bitwise equal"
        if i == 0
        else f"{regime}: {out[regime]['bitwise_equal']}/{out[regime]['layers']}"
        for i, regime in enumerate(("pow2", "native"))
    )
    return out
