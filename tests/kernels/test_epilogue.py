"""kernels/epilogue.py: the int32 accumulator / epilogue split that tensor parallelism uses.

References: an independent numpy reference of each order (float32 numpy arithmetic, bf16
rounding on the uint32 bit pattern; the exact order from Fractions) for the reference backends;
kernels.reference.accumulate_int64 (int64 arithmetic) for int_mm;
requant.kernels.scaled_mm of each registered backend (the reference emulations, and Triton
under its CPU interpreter) for int_mm + apply_epilogue; kernels.reference.quantize_activations
of the whole rows (and the Triton quantizer) for quantize_slice.
"""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from requant import kernels
from requant.kernels import reference as ref
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.epilogue import ORDER_OF, ORDERS, apply_epilogue, int_mm, order_of, quantize_slice
from tests.kernels.bf16_ref import bf16_to_f32, f32_bits, ref_round, ref_truncate, torch_bf16
from tests.kernels.operands import random_operands, tiny_rows

REFERENCES = ("reference", "reference-cutlass-order", "reference-triton-order")


def test_every_backend_has_its_documented_order():
    assert set(ORDER_OF) == set(kernels.scaled_mm_backends())
    assert set(ORDER_OF.values()) <= set(ORDERS)
    for backend, emulation in kernels.EMULATION_OF.items():  # a kernel and its oracle share the order
        assert order_of(backend) == order_of(emulation)
    with pytest.raises(KeyError, match="unknown scaled_mm backend 'nope'"):
        order_of("nope")


@pytest.mark.parametrize("shape", [(1, 24, 48), (5, 40, 300), (37, 70, 1024)])
def test_int_mm_is_the_exact_integer_sum(shape):
    a, w, _, _ = random_operands(*shape, seed=sum(shape))
    acc = int_mm(a, w)
    assert acc.dtype == torch.int32
    assert torch.equal(acc.to(torch.int64), ref.accumulate_int64(a, w))


def test_int_mm_at_the_largest_k():
    # every product -128 * -128 = 2**14 over MAX_K columns: the largest |acc| int32 must hold
    a = torch.full((2, ref.MAX_K), -128, dtype=torch.int8)
    w = torch.full((3, ref.MAX_K), -128, dtype=torch.int8)
    w[1] = 127
    acc = int_mm(a, w)
    assert acc[0, 0].item() == ref.MAX_K * 2**14 and acc[0, 1].item() == -ref.MAX_K * 128 * 127
    with pytest.raises(ValueError, match="exceeds"):
        int_mm(torch.zeros(1, ref.MAX_K + 1, dtype=torch.int8), torch.zeros(1, ref.MAX_K + 1, dtype=torch.int8))


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("backend", REFERENCES)
def test_split_equals_scaled_mm(backend, pow2):
    for i, shape in enumerate([(1, 64, 256), (7, 48, 96), (33, 130, 520)]):
        a, w, s_a, s_w = random_operands(*shape, seed=10 * i + pow2, pow2=pow2)
        got = apply_epilogue(int_mm(a, w), s_a, s_w, order_of(backend))
        assert bitwise_equal(got, kernels.scaled_mm(a, w, s_a, s_w, backend=backend)), (backend, shape)


@pytest.mark.parametrize("backend", REFERENCES)
def test_summed_k_slices_give_the_unsliced_bits(backend):
    """The tensor-parallel claim at the kernel level: int32 partial accumulators of K-slices,
    summed in any grouping and order, then one epilogue = scaled_mm on the whole K."""
    a, w, s_a, s_w = random_operands(9, 72, 1536, seed=3)
    want = kernels.scaled_mm(a, w, s_a, s_w, backend=backend)
    for parts in (2, 3, 4, 8):
        bounds = [round(i * 1536 / parts) for i in range(parts + 1)]
        partial = [int_mm(a[:, lo:hi], w[:, lo:hi]) for lo, hi in itertools.pairwise(bounds)]
        forward, backward = torch.zeros_like(partial[0]), torch.zeros_like(partial[0])
        for p in partial:
            forward += p
        for p in reversed(partial):
            backward += p
        assert torch.equal(forward, backward)
        assert bitwise_equal(apply_epilogue(forward, s_a, s_w, order_of(backend)), want), parts


def test_triton_split_under_the_interpreter():
    pytest.importorskip("triton")
    a, w, s_a, s_w = random_operands(3, 24, 48, seed=5)
    got = apply_epilogue(int_mm(a, w), s_a, s_w, order_of("triton"))
    assert bitwise_equal(got, kernels.scaled_mm(a, w, s_a, s_w, backend="triton"))


def _rows(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 96, generator=g) * torch.logspace(-3, 3, 6)[:, None]).to(dtype)
    x[2, 50] = 400.0  # the absmax of a row in the third slice only
    x[3] = 0.0  # a zero row
    tiny = torch.cat([tiny_rows(dtype)] * 16, dim=1)  # [7 or 6, 96]
    return torch.cat([x, tiny])


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_slice_gives_the_whole_rows_operands(backend, dtype):
    if backend == "triton":
        pytest.importorskip("triton")
    x = _rows(dtype)
    q, s = kernels.quantize_activations(x, backend="reference")
    absmax = x.abs().amax(dim=1, keepdim=True)
    for parts in (2, 3, 4):
        step = x.shape[1] // parts
        for r in range(parts):
            lo, hi = r * step, (r + 1) * step
            # the tensor-parallel way: the MAX of the slices' own absmax values
            amax = torch.stack(
                [x[:, i * step : (i + 1) * step].abs().amax(1, keepdim=True) for i in range(parts)]
            ).amax(0)
            assert torch.equal(amax, absmax)
            qs, ss = quantize_slice(x[:, lo:hi], amax.to(torch.float32), backend=backend)
            assert torch.equal(qs, q[:, lo:hi]), (parts, r)
            assert torch.equal(ss.view(torch.int32), s.view(torch.int32)), (parts, r)


def test_bad_operands_are_named():
    a, w, s_a, s_w = random_operands(2, 8, 16)
    with pytest.raises(TypeError, match="int8"):
        int_mm(a.float(), w)
    with pytest.raises(ValueError, match="a \\[M, K\\] and w \\[N, K\\]"):
        int_mm(a, w[:, :8])
    acc = int_mm(a, w)
    with pytest.raises(ValueError, match="unknown epilogue order 'fma'"):
        apply_epilogue(acc, s_a, s_w, "fma")
    with pytest.raises(TypeError, match="int32"):
        apply_epilogue(acc.float(), s_a, s_w, "triton")
    with pytest.raises(ValueError, match="s_a \\[2, 1\\]"):
        apply_epilogue(acc, s_w, s_w, "triton")
    with pytest.raises(ValueError, match="absmax must be"):
        quantize_slice(torch.zeros(2, 4), torch.zeros(3, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(1, 24, 48), (16, 64, 256), (17, 40, 300), (130, 72, 1000)])
def test_int_mm_cuda_is_exact(shape):
    a, w, _, _ = random_operands(*shape, seed=sum(shape), device="cuda")
    assert torch.equal(int_mm(a, w).cpu(), ref.accumulate(a.cpu(), w.cpu()))


def _numpy_epilogue(acc: np.ndarray, s_a: np.ndarray, s_w: np.ndarray, order: str) -> np.ndarray:
    """bf16 bits (uint16) of each order written out in numpy float32 arithmetic (one operation,
    one fp32 rounding, as the order's formula says), rounded to bf16 on the uint32 bit pattern."""
    f = acc.astype(np.float32)  # |acc| < 2**31: the int -> fp32 conversion rounds to nearest even
    sa, sw = s_a.reshape(-1, 1).astype(np.float32), s_w.reshape(1, -1).astype(np.float32)
    if order == "cutlass":
        v = sa * (sw * f)
    elif order == "triton":
        v = (sa * f) * sw
    elif order == "fused":
        v = f * (sa * sw)
    else:
        raise ValueError(order)
    assert v.dtype == np.float32
    return ref_round(f32_bits(v))


def _bf16_of_rational(v: Fraction) -> int:
    """bf16 bits of the exact rational v rounded once, ties to even: of the bf16 neighbours of
    float32(v), the one nearest v by exact Fraction distance (an even bit pattern on a tie)."""
    if v == 0:
        return 0
    mag = abs(v)
    near = int(ref_truncate(f32_bits(np.array([float(mag)], dtype=np.float32)))[0])
    cands = [c for c in (near - 1, near, near + 1, near + 2) if 0 <= c < 0x7F80]
    value = {c: Fraction(float(bf16_to_f32(np.array([c], dtype=np.uint16))[0])) for c in cands}
    best = min(cands, key=lambda c: (abs(value[c] - mag), c & 1))
    return best | (0x8000 if v < 0 else 0)


def _numpy_reference(a, w, s_a, s_w, order: str) -> np.ndarray:
    acc = a.numpy().astype(np.int64) @ w.numpy().astype(np.int64).T  # exact: |acc| < 2**31
    if order != "exact":
        return _numpy_epilogue(acc, s_a.numpy(), s_w.numpy(), order)
    sa, sw = s_a.numpy().reshape(-1), s_w.numpy().reshape(-1)
    bits = [
        _bf16_of_rational(Fraction(int(acc[r, c])) * Fraction(float(sa[r])) * Fraction(float(sw[c])))
        for r in range(acc.shape[0])
        for c in range(acc.shape[1])
    ]
    return np.array(bits, dtype=np.uint16).reshape(acc.shape)


@pytest.fixture(scope="module")
def operand_sets():
    """The conformance kit's crafted epilogue vectors (on which every two orders give different
    bits: random operands almost never do once rounded to bf16) and seeded random operands."""
    from requant.audit.conform import vectors as V

    (crafted,) = [c for c in V.build_vectors(batch_ms=(1,)).cases if c.name == "epilogue"]
    sets = {"crafted": (crafted.a, crafted.w, crafted.s_a, crafted.s_w)}
    for pow2 in (False, True):
        sets[f"random-pow2={pow2}"] = tuple(random_operands(6, 9, 300, seed=41 + pow2, pow2=pow2))
    return sets


def test_numpy_reference_tells_the_orders_apart(operand_sets):
    bits = {order: _numpy_reference(*operand_sets["crafted"], order) for order in ORDERS}
    for x, y in itertools.combinations(ORDERS, 2):
        assert not np.array_equal(bits[x], bits[y]), (x, y)


@pytest.mark.parametrize("backend", REFERENCES + ("reference-fused-order",))
def test_reference_backends_against_numpy(backend, operand_sets):
    """The reference backends bit for bit against an independent numpy reference: the exact
    accumulator in int64 numpy, each order's float32 operations in numpy, and the bf16 rounding
    on the uint32 bit pattern (tests/kernels/bf16_ref.py); the exact order from Fractions."""
    for name, (a, w, s_a, s_w) in operand_sets.items():
        want = torch_bf16(_numpy_reference(a, w, s_a, s_w, order_of(backend)))
        got = kernels.scaled_mm(a, w, s_a, s_w, backend=backend)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (backend, name)
