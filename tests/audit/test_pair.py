"""audit/pair.py: --backends names and --order become two kernels (kernels.ScaledMM), each with the
order it declares, and nothing is registered. The fingerprinted path (no --order) is exercised by
the commands in tests/audit/test_custom_backends.py and test_user_kernels.py; here the cheap
paths and every refusal. Reference for the bits: the documented order's emulation, called by name."""

import pytest
import torch

from requant import kernels
from requant.audit.pair import resolve_pair
from requant.backends import REFERENCE_PAIR, parse_backends
from tests.kernels.operands import random_operands

TRITON = "tests.audit.custom_kernels:triton_order"


def test_builtin_pair_is_looked_up_with_its_orders():
    got = resolve_pair(REFERENCE_PAIR, None, "cpu")
    assert got.kernels == REFERENCE_PAIR and got.custom == {} and got.failure is None
    assert [k.order for k in got.kernels] == ["cutlass-order", "triton-order"]


@pytest.mark.parametrize("order", ["cutlass-order", "triton-order", "fused-order"])
def test_a_custom_member_carries_the_given_order_and_runs_guarded(order):
    before = kernels.scaled_mm_backends()
    got = resolve_pair(parse_backends(f"reference-cutlass-order,{TRITON}"), order, "cpu")
    assert got.custom == {TRITON: {"order": order, "source": "--order", "verdict": None}}
    k = got.kernels[1]
    assert (k, k.order, kernels.emulation_of(k)) == (TRITON, order, f"reference-{order}")
    assert kernels.scaled_mm_backends() == before  # registered nowhere
    for seed, shape in enumerate([(1, 1, 1), (3, 5, 7), (24, 16, 64)]):
        ops = random_operands(*shape, seed=seed)
        y = kernels.scaled_mm(*ops, backend=k)  # the guarded user function itself
        want = kernels.scaled_mm(*ops, backend="reference-triton-order")
        assert y.view(torch.int16).equal(want.view(torch.int16))


@pytest.mark.parametrize(
    "names, order, words",
    [
        (REFERENCE_PAIR, "triton-order", "--order applies to MODULE:FUNCTION members of --backends only"),
        ((TRITON, "m:f"), "triton-order,cutlass-order,fused-order", "--order takes one order or one per"),
        (("reference-cutlass-order", TRITON), "exact", "--order 'exact': known orders are"),
        (("reference-cutlass-order", "requant.no_such_module:f"), "triton-order", "--backends requant.no_such"),
        (("reference-cutlass-order", "tests.audit.custom_kernels:nothing"), None, "has no callable 'nothing'"),
    ],
)
def test_refusals_name_the_option(names, order, words):
    with pytest.raises(ValueError) as exc:
        resolve_pair(names, order, "cpu")
    assert words in str(exc.value)
