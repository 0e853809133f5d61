"""Tiny scaled_mm kernels with conform's signature, for `--backends MODULE:FUNCTION` tests.

Written from the definitions, independently of requant.kernels.reference: the exact int8
dot products in float64 (every |acc| < 2**53), then the Triton order (acc * s_a) * s_w in
fp32 and torch's fp32 -> bf16 cast (round half to even).
"""

import torch

__all__ = ["triton_order", "wrong_at_decode", "double_rounds", "two_args", "DECODE_M"]

DECODE_M = 8  # wrong_at_decode is wrong for M <= DECODE_M only


def triton_order(a, w, s_a, s_w):
    acc = (a.to(torch.float64) @ w.to(torch.float64).T).to(torch.float32)
    return ((acc * s_a.reshape(-1, 1)) * s_w.reshape(1, -1)).to(torch.bfloat16)


def wrong_at_decode(a, w, s_a, s_w):
    """The Triton order, except that at M <= DECODE_M the final cast truncates (rounds toward
    zero): a decode-tile bug that no prefill (M = all prompt tokens) reaches."""
    if a.shape[0] > DECODE_M:
        return triton_order(a, w, s_a, s_w)
    acc = (a.to(torch.float64) @ w.to(torch.float64).T).to(torch.float32)
    y = (acc * s_a.reshape(-1, 1)) * s_w.reshape(1, -1)
    bits = y.view(torch.int32) & ~0xFFFF  # drop the low 16 bits: round toward zero
    return (bits >> 16).to(torch.int16).view(torch.bfloat16)


def double_rounds(a, w, s_a, s_w):
    """Rounds to bf16 after s_a, then multiplies by s_w and rounds again: no legal formula."""
    acc = (a.to(torch.float64) @ w.to(torch.float64).T).to(torch.float32)
    first = (acc * s_a.reshape(-1, 1)).to(torch.bfloat16).to(torch.float32)
    return (first * s_w.reshape(1, -1)).to(torch.bfloat16)


def two_args(a, w):
    """Not conform's signature: cannot be run as a scaled_mm."""
    return (a.to(torch.float32) @ w.to(torch.float32).T).to(torch.bfloat16)
