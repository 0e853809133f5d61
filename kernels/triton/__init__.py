"""Triton backend: the W8A8 scaled GEMM (Triton epilogue order) and the per-token
activation quantization. Runs on a CUDA GPU (Triton >= 3.6) or on CPU tensors under
Triton's interpreter (TRITON_INTERPRET=1 set before Triton is imported; Triton >= 3.9),
with the same bits in both places. See scaled_mm.py and quantize.py for the numerics, and
_launch.py for the per-call host path (launches on the operands' GPU, whichever is current).
"""

import torch

from requant.kernels.triton._launch import INTERPRET as _INTERPRET
from requant.kernels.triton.quantize import quantize_activations as _quantize
from requant.kernels.triton.scaled_mm import scaled_mm as _scaled_mm


def _check_device(t: torch.Tensor) -> None:
    if t.is_cuda or (_INTERPRET and t.device.type == "cpu"):
        return
    raise RuntimeError(
        f"the Triton backend needs CUDA tensors (got {t.device}); for CPU tensors set "
        "TRITON_INTERPRET=1 before importing triton (CI does)"
    )


def scaled_mm(a, w, s_a, s_w, config=None, cached=True):
    _check_device(a)
    return _scaled_mm(a, w, s_a, s_w, config=config, cached=cached)


def quantize_activations(x, check=None, cached=True):
    _check_device(x)
    return _quantize(x, check=check, cached=cached)


__all__ = ["scaled_mm", "quantize_activations"]
