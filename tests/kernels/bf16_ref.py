"""Independent bf16 rounding for tests: numpy integer arithmetic on float32 bit patterns,
written differently from requant.kernels.bf16 (an explicit comparison of the dropped
half-word with the tie 0x8000, not the add-0x7FFF-plus-lsb trick). tests/kernels/test_bf16.py
checks it against IEEE test vectors and torch's own cast; other tests use it as the
reference for anything that rounds to bf16."""

import numpy as np
import torch


def is_nan_bits(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint64)
    return (((u >> 23) & 0xFF) == 0xFF) & ((u & 0x7FFFFF) != 0)


def ref_round(u: np.ndarray) -> np.ndarray:
    """fp32 bits (uint32) -> bf16 bits (uint16), round half to even.

    Keep the high half-word; add one when the dropped half-word is above the tie, or at the
    tie with an odd kept half-word. A carry out of the mantissa correctly bumps the exponent
    (the largest finite values round up to inf). NaN stays NaN, its sign and high payload
    kept and the quiet bit set (requant's contract)."""
    u = u.astype(np.uint64)
    hi, lo = u >> 16, u & 0xFFFF
    up = (lo > 0x8000) | ((lo == 0x8000) & ((hi & 1) == 1))
    out = np.where(is_nan_bits(u), hi | 0x40, hi + up)
    assert int(out.max(initial=0)) <= 0xFFFF
    return out.astype(np.uint16)


def ref_truncate(u: np.ndarray) -> np.ndarray:
    """fp32 bits (uint32) -> bf16 bits (uint16), toward zero: the high half-word."""
    return (u.astype(np.uint64) >> 16).astype(np.uint16)


def f32_bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> their float32 values (exact: the bits shifted up)."""
    return (b.astype(np.uint32) << 16).view(np.float32)


def torch_bf16(b: np.ndarray) -> torch.Tensor:
    """bf16 bits (uint16) as a torch bfloat16 tensor (for bitwise comparison)."""
    return torch.from_numpy(np.ascontiguousarray(b).view(np.int16).copy()).view(torch.bfloat16)
