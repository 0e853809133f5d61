"""Triton kernels, bitwise against the oracle. On CPU they run under Triton's interpreter
(conftest.py sets TRITON_INTERPRET=1); on a GPU the same tests compile real kernels.

References: kernels.reference.scaled_mm_triton_order (the emulated Triton order) for the
GEMM, kernels.reference.scaled_mm_cutlass_order for the cross-order claims, and
kernels.reference.quantize_activations for the activation quantization.
"""

import re

import pytest
import torch

pytest.importorskip("triton")

from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bf16_bits, bitwise_equal, ulp_distance  # noqa: E402
from requant.kernels.triton import quantize_activations, scaled_mm  # noqa: E402
from requant.kernels.triton.scaled_mm import CONFIGS  # noqa: E402
from tests.kernels.operands import random_operands, tiny_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(m, n, k, seed=0, pow2=False):
    return random_operands(m, n, k, seed=seed, pow2=pow2, device=DEVICE)


def _check_triton_order(a, w, s_a, s_w, **kw):
    got = scaled_mm(a, w, s_a, s_w, **kw)
    want = ref.scaled_mm_triton_order(a, w, s_a, s_w)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert bitwise_equal(got, want), f"{int((got.view(torch.int16) != want.view(torch.int16)).sum())} outputs differ"
    return got


@pytest.mark.parametrize(
    "shape", [(1, 24, 48), (1, 200, 130), (16, 64, 256), (37, 70, 300), (130, 72, 160), (3, 1, 16)]
)
def test_random_shapes_bitwise(shape):
    _check_triton_order(*_operands(*shape, seed=sum(shape)))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_tile_config_same_bits(config):
    # Tile choice cannot change bits (exact int32 accumulation); pin it for every config.
    _check_triton_order(*_operands(150, 264, 272, seed=7), config=config)


@pytest.mark.parametrize("config", ["small", "medium_s3", "large_persist", "small_ptr"])
def test_row_strided_views(config):
    # Column slices of wider tensors: unit column stride (no copy), but a row stride of 280
    # (not a multiple of 16 bytes) although K = 272 is. TMA descriptors cannot take them,
    # so the descriptor configs must fall back to the pointer kernel.
    a_big, w_big, s_a, s_w = _operands(150, 200, 280, seed=17)
    a, w = a_big[:, :272], w_big[:, 8:]
    assert a.stride() == (280, 1) and w.stride() == (280, 1) and w.data_ptr() % 16 == 8
    _check_triton_order(a, w, s_a, s_w, config=config)
    # And a row stride that is a multiple of 16 with an aligned base: descriptors allowed.
    a_big, w_big, s_a, s_w = _operands(150, 200, 288, seed=18)
    _check_triton_order(a_big[:, :272], w_big[:, 16:], s_a, s_w, config=config)


def test_adversarial_inputs():
    m, n, k = 24, 40, 2048
    a, w, s_a, s_w = _operands(m, n, k, seed=11)
    a[0] = -128  # |acc| = k * 2**14 = 2**25: past fp32's exact integers
    w[0] = -128
    w[1] = 127
    w[2, ::2] = -128  # -128 weights (no symmetric int8 counterpart)
    a[1] = 0  # zero row, and a zero scale for it
    s_a[1] = 0
    a[2:6, :8] = 127  # outlier channels: a few saturated columns
    s_a[2:6] = 30.0  # with large activation scales
    s_w[3] = -s_w[3]  # a negative scale: -0 outputs and sign handling
    got = _check_triton_order(a, w, s_a, s_w)
    assert ref.accumulate(a[:1], w[:1]).abs().max() > 2**24
    assert torch.all(got[1] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0 in masked-off lanes (never stored)
def test_overflow_and_tiny_scales():
    a, w, s_a, s_w = _operands(8, 16, 64, seed=12)
    s_a[0] = 3.0e38  # products past bf16/fp32 range: inf, rounded like the oracle
    s_a[1] = 2.0**-140  # products in the fp32 and bf16 subnormal range
    got = _check_triton_order(a, w, s_a, s_w)
    bits = bf16_bits(got[1])
    subnormal = ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)
    assert int(subnormal.sum()) > 0, "no bf16 subnormal outputs: the case tests nothing"


def test_power_of_two_scales_equal_cutlass_order():
    a, w, s_a, s_w = _operands(48, 96, 320, seed=13, pow2=True)
    got = scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(got, ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


def test_general_scales_within_one_spacing_of_cutlass_order():
    a, w, s_a, s_w = _operands(64, 128, 512, seed=14)
    got = scaled_mm(a, w, s_a, s_w)
    assert int(ulp_distance(got, ref.scaled_mm_cutlass_order(a, w, s_a, s_w)).max()) <= 1


@pytest.mark.parametrize("shape", [(0, 8, 16), (4, 0, 16), (0, 0, 0)])
def test_empty(shape):
    m, n, k = shape
    a, w, s_a, s_w = _operands(m, n, k)
    out = scaled_mm(a, w, s_a, s_w)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16


def test_k_zero_gives_signed_zeros_like_the_oracle():
    a, w, s_a, s_w = _operands(5, 8, 0)
    s_w[2] = -s_w[2]
    _check_triton_order(a, w, s_a, s_w)


def test_operand_errors():
    a, w, s_a, s_w = _operands(4, 8, 32)
    with pytest.raises(TypeError):
        scaled_mm(a.float(), w, s_a, s_w)
    with pytest.raises(ValueError):
        scaled_mm(a, w[:, :16], s_a, s_w)


# ---- activation quantization, reference: kernels.reference.quantize_activations ----


def _check_quant(x):
    q, s = quantize_activations(x)
    q_ref, s_ref = ref.quantize_activations(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (x.shape[0], 1)
    assert torch.equal(q, q_ref)
    assert bitwise_equal(s, s_ref)
    return q, s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 2048), (9, 2500), (33, 100)])
def test_quantize_random(dtype, shape):
    g = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(*shape, generator=g) * 3).to(dtype).to(DEVICE)
    x[:, 5] *= 40  # an outlier channel
    _check_quant(x)


def test_quantize_zero_rows_and_ties():
    # absmax 127 makes inv = 1, so k + 0.5 lands exactly on a tie: half to even.
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -127.0, 126.5])
    x = torch.stack([row, torch.zeros(8), -row]).to(torch.bfloat16).to(DEVICE)
    q, s = _check_quant(x)
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, -127, 126]
    assert torch.all(q[1] == 0) and float(s[1]) == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_tiny_and_subnormal_rows(dtype):
    # Rows where the plain 127 / absmax overflows, subnormal rows (which Triton's interpreter
    # used to upcast wrongly from bf16), rows either side of the 2**-64 threshold, a zero
    # row. The reference's contract is pinned by Fractions in test_reference.py.
    x = tiny_rows(dtype).to(DEVICE)
    q, s = _check_quant(x)
    assert q[0].tolist()[:4] == [127, 0, -127, 64]
    assert float(s[1]) > 0.0  # a subnormal row keeps a (subnormal) scale
    # The same rows across several K blocks (K = 1506 > BLOCK_K), as a strided view.
    wide = torch.cat([x.repeat(1, 251), torch.zeros_like(x[:, :3])], dim=1)[:, :-3]
    assert wide.stride(0) != wide.shape[1]
    _check_quant(wide)


def test_quantize_fp16_subnormals():
    x = torch.tensor([[6e-8, -1.2e-7, 0.0, 3e-6], [1.0, -6e-8, 2.0, 0.0]], dtype=torch.float16, device=DEVICE)
    assert 0.0 < float(x[0, 0]) < 2.0**-14 and float(x[1, 1]) < 0.0  # fp16 subnormals, not flushed
    _check_quant(x)


def test_quantize_refusals_match_the_reference():
    # One shared check (kernels.reference._check_activations): the same error type for each.
    bad = [
        torch.full((2, 4), 1e300, dtype=torch.float64),  # finite in float64, inf after fp32
        torch.ones(2, 4, dtype=torch.float64),
        torch.ones(2, 4, dtype=torch.int32),
        torch.ones(2, 4, 1),
        torch.tensor([[1.0, float("inf")]]),
    ]
    for x in bad:
        x = x.to(DEVICE)
        with pytest.raises((TypeError, ValueError)) as want:
            ref.quantize_activations(x, check=True)
        with pytest.raises(want.type, match=re.escape(str(want.value))):
            quantize_activations(x, check=True)


def test_quantize_empty_and_refusals():
    for shape in [(0, 16), (3, 0)]:
        x = torch.zeros(shape, dtype=torch.bfloat16, device=DEVICE)
        q, s = quantize_activations(x)
        assert q.shape == shape and s.shape == (shape[0], 1) and torch.all(s == 0)
    x = torch.ones(2, 8, device=DEVICE)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        quantize_activations(x, check=True)
    with pytest.raises(TypeError):
        quantize_activations(torch.ones(2, 8, dtype=torch.int32, device=DEVICE))


def _rows_with_nonfinite(dtype):
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(6, 1500, generator=g) * 3).to(dtype)
    x[1, 7] = float("nan")
    x[2, 1499] = float("inf")  # in the second K block of the Triton kernel
    x[3, 0] = -float("inf")
    x[3, 5] = float("nan")
    return x.to(DEVICE), [0, 4, 5], [1, 2, 3]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0 in the interpreter, overwritten
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_unchecked_nonfinite_rows_are_poisoned(dtype):
    """check=False (what a GPU tensor gets by default): a row with NaN/inf gets s = NaN with
    the bits POISON_SCALE_BITS and q = 0, so the token's GEMM outputs are NaN; the other rows
    are untouched. Reference: the checked quantization of the finite rows alone, and the
    contract's constant; the Triton kernel must equal the reference bit for bit."""
    x, good, bad = _rows_with_nonfinite(dtype)
    q_ref, s_ref = ref.quantize_activations(x, check=False)
    q_good, s_good = ref.quantize_activations(x[good], check=True)
    assert torch.equal(q_ref[good], q_good) and bitwise_equal(s_ref[good], s_good)
    assert torch.all(q_ref[bad] == 0)
    assert torch.all(s_ref[bad].view(torch.int32) == ref.POISON_SCALE_BITS)
    q, s = quantize_activations(x, check=False)
    assert torch.equal(q, q_ref) and bitwise_equal(s, s_ref)


def test_quantize_default_check_is_free_of_device_syncs():
    """check=None refuses NaN/inf on the CPU (no device involved) and marks them on a GPU
    (no device-to-host read per call), in both backends alike. Reference: the contract in
    kernels.reference._check_activations."""
    x, good, bad = _rows_with_nonfinite(torch.bfloat16)
    if x.is_cuda:
        q, s = quantize_activations(x)
        q_ref, s_ref = ref.quantize_activations(x)
        assert torch.equal(q, q_ref) and bitwise_equal(s, s_ref) and bool(torch.isnan(s[bad]).all())
    else:
        for fn in (quantize_activations, ref.quantize_activations):
            with pytest.raises(ValueError, match="NaN or infinity"):
                fn(x)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_registry_passes_check_through():
    from requant import kernels

    x, good, bad = _rows_with_nonfinite(torch.float32)
    for backend in ("reference", "triton"):
        with pytest.raises(ValueError):
            kernels.quantize_activations(x, backend=backend, check=True)
        q, s = kernels.quantize_activations(x, backend=backend, check=False)
        assert bool(torch.isnan(s[bad]).all()) and not bool(torch.isnan(s[good]).any())
