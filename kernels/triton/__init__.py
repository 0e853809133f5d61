"""Triton backend: the W8A8 scaled GEMM (Triton epilogue order) and the per-token
activation quantization. Runs on a CUDA GPU (Triton >= 3.6) or on CPU tensors under
Triton's interpreter (TRITON_INTERPRET=1 set before Triton is imported; Triton >= 3.9),
with the same bits in both places. See scaled_mm.py and quantize.py for the numerics.
"""

import contextlib
import os

import torch

from requant.kernels.triton.quantize import quantize_activations as _quantize
from requant.kernels.triton.scaled_mm import scaled_mm as _scaled_mm

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cuda" or (_INTERPRET and t.device.type == "cpu"):
        return
    raise RuntimeError(
        f"the Triton backend needs CUDA tensors (got {t.device}); for CPU tensors set "
        "TRITON_INTERPRET=1 before importing triton (CI does)"
    )


def _on_device(t: torch.Tensor):
    """Launch on the tensor's GPU, not the current one (as the CUTLASS backend does)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def scaled_mm(a, w, s_a, s_w, config=None):
    _check_device(a)
    with _on_device(a):
        return _scaled_mm(a, w, s_a, s_w, config=config)


def quantize_activations(x):
    _check_device(x)
    with _on_device(x):
        return _quantize(x)


__all__ = ["scaled_mm", "quantize_activations"]
