"""The W8A8 GEMM split in two: the exact int32 accumulator, then a backend's epilogue.

    acc = int_mm(a, w)                                   # int32 [M, N], exact
    y   = apply_epilogue(acc, s_a, s_w, order_of(name))  # bf16 [M, N]
    # equals requant.kernels.scaled_mm(a, w, s_a, s_w, backend=name), bit for bit
    q, s = quantize_slice(x[:, k0:k1], absmax)           # = quantize_activations(x) sliced

Why split: a row-parallel Linear under tensor parallelism holds a slice of K on each rank.
Summing the ranks' int32 accumulators is exact integer addition (associative: any order,
any grouping gives the one sum), so applying the epilogue once to that sum gives the bits
of the unsharded GEMM, whatever the number of ranks or the all-reduce algorithm.

Why quantize_slice gives the whole row's bits: docs/tensor-parallel.md#numerics-requanttpenginepy-kernelsepiloguepy.
"""

import torch

from requant.kernels import quantize_activations
from requant.kernels.reference import (
    MAX_K,
    accumulate,
    epilogue_cutlass_order,
    epilogue_exact,
    epilogue_fused_order,
    epilogue_triton_order,
)

__all__ = ["ORDERS", "ORDER_OF", "apply_epilogue", "int_mm", "order_of", "quantize_slice"]

_EPILOGUES = {
    "cutlass": epilogue_cutlass_order,
    "triton": epilogue_triton_order,
    "fused": epilogue_fused_order,
    "exact": epilogue_exact,
}
ORDERS = tuple(_EPILOGUES)
# The epilogue order of every registered scaled_mm backend (kernels/__init__.py).
ORDER_OF = {
    "reference": "exact",
    "reference-cutlass-order": "cutlass",
    "reference-triton-order": "triton",
    "reference-fused-order": "fused",
    "triton": "triton",
    "cutlass": "cutlass",
    "cublas": "fused",
    "reference-vllm-moe-order": "triton",
}


def order_of(backend: str) -> str:
    """The epilogue order a scaled_mm backend implements; KeyError for an unknown name."""
    try:
        return ORDER_OF[backend]
    except KeyError:
        raise KeyError(f"unknown scaled_mm backend {backend!r}; known: {', '.join(ORDER_OF)}") from None


def _check(a: torch.Tensor, w: torch.Tensor) -> None:
    if a.dtype is not torch.int8 or w.dtype is not torch.int8:
        raise TypeError(f"int_mm needs int8 operands, got a {a.dtype}, w {w.dtype}")
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"int_mm needs a [M, K] and w [N, K], got a {tuple(a.shape)}, w {tuple(w.shape)}")
    if a.shape[1] > MAX_K:
        raise ValueError(f"K={a.shape[1]} exceeds {MAX_K}: an int32 accumulator could overflow")
    if a.device != w.device:
        raise ValueError(f"int_mm operands on several devices: a on {a.device}, w on {w.device}")


def int_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact int32 accumulator a @ w^T: a int8 [M, K], w int8 [N, K] -> int32 [M, N]."""
    _check(a, w)
    m, k = a.shape
    n = w.shape[0]
    if a.device.type != "cuda" or m == 0 or n == 0 or k == 0:
        return accumulate(a, w)
    from requant.kernels.cublas import int_mm_exact  # torch._int_mm with the padding it needs

    return int_mm_exact(a, w)


def apply_epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, order: str) -> torch.Tensor:
    """bf16 [M, N] from int32 acc [M, N], s_a fp32 [M, 1], s_w fp32 [N, 1], in one ORDERS order."""
    fn = _EPILOGUES.get(order)
    if fn is None:
        raise ValueError(f"unknown epilogue order {order!r}; known: {', '.join(ORDERS)}")
    if acc.dtype is not torch.int32 or acc.dim() != 2:
        raise TypeError(f"acc must be a 2-D int32 tensor, got {acc.dtype} {tuple(acc.shape)}")
    if tuple(s_a.shape) != (acc.shape[0], 1) or tuple(s_w.shape) != (acc.shape[1], 1):
        raise ValueError(
            f"scales must be s_a [{acc.shape[0]}, 1] and s_w [{acc.shape[1]}, 1], "
            f"got {tuple(s_a.shape)} and {tuple(s_w.shape)}"
        )
    return fn(acc, s_a, s_w)


def quantize_slice(
    x: torch.Tensor, absmax: torch.Tensor, backend: str = "reference"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [M, k], s fp32 [M, 1]) of a K-slice x [M, k] of rows whose whole absmax
    (max |x| over the full row, [M, 1], >= the slice's own) is given: the columns and the
    scale that quantize_activations gives the whole rows (module docstring)."""
    if absmax.shape != (x.shape[0], 1):
        raise ValueError(f"absmax must be [{x.shape[0]}, 1], got {tuple(absmax.shape)}")
    q, s = quantize_activations(torch.cat([x, absmax.to(x.dtype)], dim=1), backend=backend)
    return q[:, :-1].contiguous(), s
