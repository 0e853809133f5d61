"""The cublas backend (kernels/cublas.py) bit for bit against its reference emulation,
kernels.reference.scaled_mm_fused_order (exact float64 accumulator, then the fused-scale
order in separate fp32 ops), on CPU (torch's int8 matmul) and, when a GPU is present, on
cuBLASLt (torch._int_mm) including the shapes it needs padded (M <= 16, K or N not a
multiple of 8). Under power-of-two weight scales it equals both other orders."""

import pytest
import torch

from requant.kernels import cublas, scaled_mm
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.reference import accumulate, scaled_mm_cutlass_order, scaled_mm_fused_order, scaled_mm_triton_order
from tests.kernels.operands import random_operands

SHAPES = [(1, 8, 8), (5, 3, 7), (16, 64, 24), (17, 96, 40), (33, 1000, 9), (64, 256, 128)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_bitwise_equal_to_the_fused_order_emulation(device, m, k, n):
    for seed, pow2 in ((m + k, False), (n + 1, True)):
        a, w, s_a, s_w = random_operands(m, n, k, seed=seed, pow2=pow2, device=device)
        y = cublas.scaled_mm(a, w, s_a, s_w)
        assert y.dtype == torch.bfloat16 and y.shape == (m, n) and y.device.type == device
        assert bitwise_equal(y, scaled_mm_fused_order(a, w, s_a, s_w))
        assert bitwise_equal(y, scaled_mm(a, w, s_a, s_w, backend="cublas"))
        if pow2:
            assert bitwise_equal(y, scaled_mm_cutlass_order(a, w, s_a, s_w))
            assert bitwise_equal(y, scaled_mm_triton_order(a, w, s_a, s_w))


@pytest.mark.parametrize("device", DEVICES)
def test_accumulator_is_exact_at_the_int8_extremes(device):
    k = 4096
    a = torch.full((20, k), -128, dtype=torch.int8, device=device)
    w = torch.full((16, k), -128, dtype=torch.int8, device=device)
    w[1::2] = 127
    acc = cublas.int_mm_exact(a, w)
    assert acc.dtype == torch.int32 and torch.equal(acc.cpu(), accumulate(a.cpu(), w.cpu()))
    assert int(acc[0, 0]) == k * 2**14 and int(acc[0, 1]) == -k * 128 * 127


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_zero_k(device):
    for m, k, n in ((0, 8, 8), (4, 8, 0), (4, 0, 8)):
        a, w, s_a, s_w = random_operands(m, n, k, device=device)
        y = cublas.scaled_mm(a, w, s_a, s_w)
        assert y.shape == (m, n) and bitwise_equal(y, scaled_mm_fused_order(a, w, s_a, s_w))


def test_operand_contract_is_checked():
    a, w, s_a, s_w = random_operands(4, 8, 16)
    with pytest.raises(TypeError, match="a must be torch.int8"):
        cublas.scaled_mm(a.float(), w, s_a, s_w)
    with pytest.raises(ValueError, match="s_w must be"):
        cublas.scaled_mm(a, w, s_a, s_w[:3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_gpu_batch_invariance_and_qwen3_shapes():
    for n, k in ((2048, 2048), (1024, 2048), (6144, 2048), (2048, 6144)):
        a, w, s_a, s_w = random_operands(4096, n, k, seed=n + k, device="cuda")
        y = cublas.scaled_mm(a, w, s_a, s_w)
        assert bitwise_equal(y, scaled_mm_fused_order(a, w, s_a, s_w))
        for m in (1, 16, 17, 512, 2048):
            assert bitwise_equal(cublas.scaled_mm(a[:m], w, s_a[:m], s_w), y[:m])
