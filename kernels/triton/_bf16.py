"""fp32 -> bf16 round-to-nearest-even on the integer bits, as a Triton device function.

Why not `y.to(tl.bfloat16)`: on a GPU it rounds to nearest even, but Triton's CPU
interpreter (TRITON_INTERPRET=1, what CI runs) truncates. Doing the rounding on the
bits makes the kernel give the same bits in both places, and it is the very rule of
kernels.bf16.round_fp32_to_bf16 (the oracle's rounding):

    u = bits(y); rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16

Overflow is right by construction (the largest finite fp32 rounds up to the bf16 inf
pattern 0x7F80, inf stays inf). NaN only appears if a scale is NaN; it is mapped to the
oracle's quiet NaN (u >> 16) | 0x40 so that even that case is bitwise equal.
The result is returned as int16 bits: the wrappers store into an int16 view of the bf16
output, which works the same on the GPU and in the interpreter.
"""

import triton
import triton.language as tl


@triton.jit
def bf16_rne_bits(y):
    """fp32 tensor -> int16 tensor holding the bf16 bits of bf16_rne(y)."""
    u = y.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u >> 16) | 0x40
    bits = tl.where(y != y, nan, rounded)
    return bits.to(tl.uint16).to(tl.int16, bitcast=True)
