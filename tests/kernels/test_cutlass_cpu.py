"""The CUTLASS backend where no sm90 GPU is: clear errors, never a silent fallback.
Reference: none (error behaviour only)."""

import pytest
import torch

import kernels

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")


def test_cutlass_refuses_without_gpu():
    a = torch.zeros(2, 16, dtype=torch.int8)
    w = torch.zeros(8, 16, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="sm90"):
        kernels.scaled_mm(a, w, torch.ones(2, 1), torch.ones(8, 1), backend="cutlass")


def test_cutlass_build_refuses_without_gpu():
    from kernels import cutlass

    with pytest.raises(RuntimeError, match="sm90"):
        cutlass.build()


def test_cutlass_sources_ship():
    import os

    from kernels import cutlass

    for src in cutlass.SOURCES + ["w8a8_sm90.cuh", "w8a8_sm90.h"]:
        assert os.path.isfile(os.path.join(os.path.dirname(cutlass.__file__), src)), src
