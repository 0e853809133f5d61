"""Kernel tests: on a machine without CUDA, run Triton under its CPU interpreter.

TRITON_INTERPRET must be set before kernels.triton is imported (triton.jit decides at
decoration time), so it is set here, at collection, and only where no GPU is present:
on a GPU machine the same tests compile real kernels.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
