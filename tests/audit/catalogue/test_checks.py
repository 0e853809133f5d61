"""audit/catalogue/checks.py: each check on crafted runs. References: kernels.reference.MAX_K (the
int32 accumulator bound), kernels.bf16.is_power_of_two and ulp_distance (the spacing)."""

import torch

from requant.audit.catalogue.checks import (
    FIRE,
    NOT_APPLICABLE,
    SILENT,
    c3_accumulator_precondition,
    run_checks,
    token_risk,
)
from requant.audit.catalogue.faults import VARIANT_BY_ID, inject
from requant.audit.records import REFERENCE_KERNEL, Activations, KernelDesc, Run, Weights
from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.reference import MAX_K
from tests.audit.conftest import make_case, make_operands


def outcomes(ref, test, kernel=None):
    return {c: r.outcome for c, r in run_checks(ref, test, kernel).items()}


def run_with_k(k, kernel):
    act, wt = make_operands(0, m=2, k=k, n=2)
    return Run(act, wt, None, None, kernel)


def test_c3_is_static_against_k_times_2_14():
    """int32 holds K*2**14 iff K <= MAX_K (kernels.reference); fp32 iff K*2**14 <= 2**24."""
    int32 = REFERENCE_KERNEL
    fp32 = KernelDesc("fp32", "float", 24, "x")
    assert not c3_accumulator_precondition(None, run_with_k(1024, int32), int32).fired
    assert int32.exact_integer_bound() == 2**31 - 1 and MAX_K * 2**14 <= 2**31 - 1 < (MAX_K + 1) * 2**14
    assert not c3_accumulator_precondition(None, run_with_k(1024, fp32), fp32).fired  # 2**24 exactly
    assert c3_accumulator_precondition(None, run_with_k(1025, fp32), fp32).fired
    assert c3_accumulator_precondition(
        None, run_with_k(2, KernelDesc("i16", "int", 16, "x")), KernelDesc("i16", "int", 16, "x")
    ).fired
    assert c3_accumulator_precondition(
        None, run_with_k(1, KernelDesc("bf16", "float", 8, "x")), KernelDesc("bf16", "float", 8, "x")
    ).fired


def test_reference_against_itself_is_silent_and_c5_needs_pow2():
    native, pow2 = make_case(1), make_case(2, pow2=True)
    o = outcomes(native.ref, native.ref)
    assert o == {
        "C1": SILENT,
        "C2": SILENT,
        "C3": SILENT,
        "C4": SILENT,
        "C5": NOT_APPLICABLE,
        "C6": SILENT,
        "C7": NOT_APPLICABLE,
    }
    assert outcomes(pow2.ref, pow2.ref)["C5"] == SILENT


def test_c6_threshold_is_one_spacing_and_c5_is_equality():
    case = make_case(3, pow2=True)
    y = case.ref.y.clone()
    bits = y.view(torch.int16)
    bits[0, 0] += 1  # one spacing (same sign, finite)
    one = Run(case.act, case.wt, case.acc, y, REFERENCE_KERNEL)
    assert outcomes(case.ref, one)["C6"] == SILENT and outcomes(case.ref, one)["C5"] == FIRE
    y2 = case.ref.y.clone()
    y2.view(torch.int16)[0, 0] += 2
    two = Run(case.act, case.wt, case.acc, y2, REFERENCE_KERNEL)
    assert outcomes(case.ref, two)["C6"] == FIRE


def test_c1_c2_c4_see_operands_and_accumulator():
    case = make_case(4)
    a2 = case.act.a.clone()
    a2[0, 0] ^= 1
    act2 = Activations(a2, case.act.s_a)
    t = Run(act2, case.wt, case.acc, case.ref.y, REFERENCE_KERNEL)
    assert outcomes(case.ref, t)["C1"] == FIRE and outcomes(case.ref, t)["C2"] == SILENT
    wt2 = Weights(case.wt.w, case.wt.s_w * 2)
    assert outcomes(case.ref, Run(case.act, wt2, case.acc, case.ref.y, REFERENCE_KERNEL))["C2"] == FIRE
    acc2 = case.acc.clone()
    acc2[0, 0] += 1
    assert outcomes(case.ref, Run(case.act, case.wt, acc2, case.ref.y, REFERENCE_KERNEL))["C4"] == FIRE
    no_acc = KernelDesc("real", "int", 32, "triton-order", exposes_acc=False)
    assert outcomes(case.ref, Run(case.act, case.wt, None, case.ref.y, no_acc))["C4"] == NOT_APPLICABLE


def test_f9a_is_invisible_to_the_accumulator_check():
    case = make_case(5, pow2=True)
    o = outcomes(case.ref, inject(VARIANT_BY_ID["F9.one"], case))
    assert o["C1"] == FIRE and o["C4"] == SILENT and o["C5"] == FIRE and o["C6"] == FIRE


def test_token_risk_arithmetic():
    ref = torch.tensor([[3.0, 2.5, 0.0], [1.0, 0.0, -1.0]])
    test = torch.tensor([[2.0, 2.5, 0.0], [1.0, 0.0, -1.0]])
    r = token_risk(ref, test)
    assert r == {
        "tokens": 2,
        "flagged": 1,
        "top1_disagreements": 1,
        "max_deviation": 1.0,
        "min_margin": 0.5,
        "bitwise_equal": False,
    }
    same = token_risk(ref, ref.clone())
    assert same["flagged"] == 0 and same["bitwise_equal"]


def test_c7_flags_a_flip_whose_margin_exceeds_the_deviation():
    """Margin 1.0 >= deviation 0.6, yet the top-1 token changes: C7 must fire."""
    ref = torch.tensor([[1.0, 0.0]])
    test = torch.tensor([[0.4, 0.6]])
    r = token_risk(ref, test)
    assert r["top1_disagreements"] == 1 and r["flagged"] == 1
    a = Run(None, None, None, None, REFERENCE_KERNEL, logits=ref)
    b = Run(None, None, None, None, REFERENCE_KERNEL, logits=test)
    assert outcomes(a, b)["C7"] == FIRE


def test_c7_only_with_logits():
    case = make_case(6)
    assert outcomes(case.ref, case.ref)["C7"] == NOT_APPLICABLE
    lg = round_fp32_to_bf16(torch.randn(4, 10, generator=torch.Generator().manual_seed(0)))
    a = Run(None, None, None, None, REFERENCE_KERNEL, logits=lg)
    assert outcomes(a, a)["C7"] == SILENT
