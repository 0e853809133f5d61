"""cuBLASLt backend: torch._int_mm (int8 x int8 -> int32) followed by the fused-scale epilogue
of TensorRT-LLM's SmoothQuant GEMM.

    acc = a @ w^T                                   exact int32 (torch._int_mm)
    y   = bf16_rne( fp32(acc) * fp32(s_a * s_w) )   three elementwise torch ops

Where the fused-scale order comes from, and why it is exact under power-of-two scales:
docs/conformance.md#the-cublas-backend.
"""

import torch

from requant.kernels.reference import check_operands

__all__ = ["scaled_mm", "int_mm_exact"]

_MIN_M = 17  # torch._int_mm on CUDA: "self.size(0) needs to be greater than 16"
_MIN_K = 32  # tiny K padded further (zeros, exact): keeps clear of any minimum-K rule of the heuristics
_ALIGN = 8


def _pad_to(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = t.shape
    if r == rows and c == cols:
        return t.contiguous()
    out = torch.zeros(rows, cols, dtype=t.dtype, device=t.device)
    out[:r, :c] = t
    return out


def int_mm_exact(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a int8 [M, K] @ w int8 [N, K]^T -> exact int32 [M, N] through torch._int_mm."""
    m, k = a.shape
    n = w.shape[0]
    if k == 0:
        return torch.zeros(m, n, dtype=torch.int32, device=a.device)
    mp = max(m, _MIN_M) if a.is_cuda else m
    kp = max(-(-k // _ALIGN) * _ALIGN, _MIN_K if a.is_cuda else 0)
    np_ = -(-n // _ALIGN) * _ALIGN
    a_p = _pad_to(a, mp, kp)
    w_p = _pad_to(w, np_, kp)
    acc = torch._int_mm(a_p, w_p.t())  # w_p.t() is column-major [K, N]: the layout cuBLASLt takes
    return acc[:m, :n]


def scaled_mm(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1], s_w fp32 [N, 1] -> bf16 [M, N]."""
    check_operands(a, w, s_a, s_w)
    m, n = a.shape[0], w.shape[0]
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    acc = int_mm_exact(a, w)
    scale = s_a.reshape(-1, 1) * s_w.reshape(1, -1)
    return (acc.to(torch.float32) * scale).to(torch.bfloat16)
