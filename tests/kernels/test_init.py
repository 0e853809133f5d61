"""kernels/__init__.py: a backend named or resolved (ScaledMM) computes the same bits, a run's kernel
is registered nowhere, and the built-in orders are read-only.

Independent reference: the reference emulation of each declared order (kernels/reference.py),
called by name; the operands are seeded (tests/kernels/operands.py), degenerate shapes included."""

import json
import pickle

import pytest
import torch

from requant import kernels
from requant.kernels import EMULATION_OF, ScaledMM
from tests.audit.custom_kernels import triton_order, wrong_at_decode
from tests.kernels.operands import random_operands

SHAPES = [(1, 1, 1), (1, 8, 16), (3, 5, 7), (24, 16, 64), (9, 33, 128)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", SHAPES)
def test_a_resolved_kernel_is_called_as_its_declared_order(seed, shape):
    ops = random_operands(*shape, seed=seed, pow2=seed % 2 == 1)
    k = ScaledMM("tests.audit.custom_kernels:triton_order", triton_order, "triton-order")
    got = kernels.scaled_mm(*ops, backend=k)
    want = kernels.scaled_mm(*ops, backend=k.emulation)  # by name: the documented Triton order
    assert got.view(torch.int16).equal(want.view(torch.int16))


def test_a_faulty_kernel_is_not_hidden_by_its_declared_order():
    """The call runs the kernel itself, never the emulation of its order (a decode-size fault shows)."""
    ops = random_operands(1, 64, 256, seed=7)
    k = ScaledMM("wrong", wrong_at_decode, "triton-order")
    got = kernels.scaled_mm(*ops, backend=k)
    want = kernels.scaled_mm(*ops, backend="reference-triton-order")
    assert not got.view(torch.int16).equal(want.view(torch.int16))


def test_lookup_gives_every_builtin_its_order_and_registers_nothing():
    before = kernels.scaled_mm_backends()
    for name in before:
        k = kernels.lookup(name)
        assert k == name and k.name == name and kernels.lookup(k) is k
        assert kernels.emulation_of(k) == kernels.emulation_of(name) == EMULATION_OF.get(name)
    ScaledMM("mod:fn", triton_order, "fused-order")
    assert kernels.scaled_mm_backends() == before and "mod:fn" not in EMULATION_OF
    with pytest.raises(KeyError, match="unknown scaled_mm backend 'mod:fn'"):
        kernels.lookup("mod:fn")


def test_emulation_table_is_read_only():
    with pytest.raises(TypeError):
        EMULATION_OF["x"] = "reference-triton-order"  # type: ignore[index]


def test_a_resolved_kernel_is_its_name_in_records():
    k = ScaledMM("m:f", triton_order, "exact")
    assert json.dumps({k: [k]}) == '{"m:f": ["m:f"]}' and {"m:f": 1}[k] == 1
    assert (k.emulation, ScaledMM("m:g", triton_order).emulation) == ("reference", None)
    back = pickle.loads(pickle.dumps(k))
    assert (back, back.fn, back.order) == ("m:f", triton_order, "exact")
    with pytest.raises(ValueError, match="'m:h'.*not callable"):
        ScaledMM("m:h", None)
