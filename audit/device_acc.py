"""Exact accumulators on the operands' device, for the audit's batched cells and its injection.

exact_accumulate(a, w) is kernels.reference.accumulate's exact int32 [M, N]: on CUDA through
cuBLASLt's int8 GEMM (kernels.cublas.int_mm_exact: int32 products and sums, exact whatever the
summation order since |acc| <= K * 2**14 < 2**31), elsewhere the float64 definition itself. Both
are the exact integer, so they are equal; the GPU tests compare the batched path (this) with the
per-cell path (the definition) cell by cell.
"""

from __future__ import annotations

import torch

from requant.kernels.cublas import int_mm_exact
from requant.kernels.reference import MAX_K, accumulate


def exact_accumulate(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The exact int32 accumulator a @ w^T (int8 [M, K], int8 [N, K])."""
    if a.device.type == "cuda" and 0 < a.shape[1] <= MAX_K:
        return int_mm_exact(a, w)
    return accumulate(a, w)
