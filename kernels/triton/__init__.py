"""Triton backend: the W8A8 scaled GEMM (Triton epilogue order) and the per-token
activation quantization. Runs on a CUDA GPU (Triton >= 3.6) or on CPU tensors under
Triton's interpreter (TRITON_INTERPRET=1 set before Triton is imported; Triton >= 3.9),
with the same bits in both places; other tensors are refused with a RuntimeError. See
scaled_mm.py and quantize.py for the numerics, and _launch.py for the per-call host path
(launches on the operands' GPU, whichever is current).

    scaled_mm(a, w, s_a, s_w, config=None, cached=True)
    quantize_activations(x, check=None, cached=True)

The other kernels here are the engines': fused.py (the fast engine's row kernels), attention.py
(split-KV attention), dense.py (the bf16 lm_head), portable.py with _portable_math.py (the portable
arithmetic); _bf16.py the bf16 rounding on bits, _launch.py the cached launches. Each equals its torch
form in kernels/ bit for bit (emulation.py, portable.py, reference.py).
"""

from requant.kernels.triton.quantize import quantize_activations
from requant.kernels.triton.scaled_mm import scaled_mm

__all__ = ["scaled_mm", "quantize_activations"]
