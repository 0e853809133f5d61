"""audit/faults.py against the exact reference (kernels.reference: accumulate,
accumulate_int64, epilogue_triton_order, epilogue_cutlass_order; kernels.bf16 rounding
helpers). Bitwise assertions only."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from requant.audit.faults import (F9A_FACTOR, VARIANT_BY_ID, VARIANTS, accumulate_bf16_tiles, inject, shift_int8_by_one,
                          wrap_int16)
from requant.kernels.bf16 import bitwise_equal, round_fp32_to_bf16, truncate_fp32_to_bf16, ulp_distance
from requant.kernels.reference import accumulate_int64, epilogue_cutlass_order, epilogue_triton_order
from tests.audit.conftest import make_case

EPILOGUE = ("F1", "F2", "F3", "F4", "F5")


def changed(y, ref):
    return int((y.view(torch.int16) != ref.view(torch.int16)).sum())


def test_catalogue_shape():
    assert len(VARIANTS) == 21
    fams = [v.family for v in VARIANTS]
    assert {f: fams.count(f) for f in set(fams)} == {"F1": 3, "F2": 3, "F3": 3, "F4": 3, "F5": 3, "F6": 1, "F7": 1, "F8": 1, "F9": 3}
    assert len({v.id for v in VARIANTS}) == 21


def test_reference_case_is_the_triton_order():
    case = make_case(1)
    assert torch.equal(case.acc.to(torch.int64), accumulate_int64(case.act.a, case.wt.w))
    assert bitwise_equal(case.ref.y, epilogue_triton_order(case.acc, case.act.s_a, case.wt.s_w))


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_epilogue_faults_commute_under_pow2_except_f4(seed):
    """F1, F2, F3, F5 give the reference bits when every s_w is a power of two; F4 does not."""
    case = make_case(seed, pow2=True)
    for fam in ("F1", "F2", "F3", "F5"):
        run = inject(VARIANT_BY_ID[f"{fam}.all"], case)
        assert bitwise_equal(run.y, case.ref.y), fam
    f4 = inject(VARIANT_BY_ID["F4.all"], case)
    # reference: kernels.bf16.truncate_fp32_to_bf16 of the legal fp32 product
    assert bitwise_equal(f4.y, truncate_fp32_to_bf16(case.act.s_a * case.acc.to(torch.float32) * case.wt.s_w.reshape(1, -1)))
    assert not bitwise_equal(f4.y, case.ref.y)  # truncation is visible under pow2


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 2**31 - 1), pow2=st.booleans())
def test_epilogue_faults_move_at_most_one_spacing(seed, pow2):
    case = make_case(seed, pow2=pow2, m=32, k=128, n=64)
    for fam in EPILOGUE:
        for sev in ("one", "1pct", "all"):
            run = inject(VARIANT_BY_ID[f"{fam}.{sev}"], case)
            assert int(ulp_distance(run.y, case.ref.y).max()) <= 1, (fam, sev)
            assert run.acc is case.acc and run.act is case.act and run.wt is case.wt


def test_f3_is_the_cutlass_order_and_f4_truncates():
    case = make_case(7)
    assert bitwise_equal(inject(VARIANT_BY_ID["F3.all"], case).y, epilogue_cutlass_order(case.acc, case.act.s_a, case.wt.s_w))
    inner = case.act.s_a * case.acc.to(torch.float32)
    assert bitwise_equal(inject(VARIANT_BY_ID["F4.all"], case).y, truncate_fp32_to_bf16(inner * case.wt.s_w.reshape(1, -1)))
    f2 = round_fp32_to_bf16(round_fp32_to_bf16(inner).to(torch.float32) * case.wt.s_w.reshape(1, -1))
    assert bitwise_equal(inject(VARIANT_BY_ID["F2.all"], case).y, f2)


def test_severity_one_changes_exactly_one_element_when_the_fault_acts():
    case = make_case(3, m=64, k=128, n=96)
    for fam in EPILOGUE:
        full = changed(inject(VARIANT_BY_ID[f"{fam}.all"], case).y, case.ref.y)
        one = changed(inject(VARIANT_BY_ID[f"{fam}.one"], case).y, case.ref.y)
        assert one == (1 if full else 0), fam
        pct = changed(inject(VARIANT_BY_ID[f"{fam}.1pct"], case).y, case.ref.y)
        assert pct <= min(full, math.ceil(0.01 * 64 * 96)), fam


def test_injection_is_deterministic():
    a, b = make_case(11), make_case(11)
    for v in VARIANTS:
        ra, rb = inject(v, a), inject(v, b)
        assert bitwise_equal(ra.y, rb.y), v.id
        assert ra.act.digest() == rb.act.digest(), v.id


def test_f6_accumulates_in_bf16():
    case = make_case(5, k=256)
    run = inject(VARIANT_BY_ID["F6.all"], case)
    assert run.kernel.acc_kind == "float" and run.kernel.acc_bits == 8
    assert torch.equal(run.acc, run.acc.to(torch.bfloat16).to(torch.float32))  # every value is a bf16
    assert not torch.equal(run.acc.to(torch.float64), case.acc.to(torch.float64))
    # one tile: no rounding between tiles beyond the final bf16 cast of an exact sum
    small = make_case(6, k=64)
    assert torch.equal(accumulate_bf16_tiles(small.act.a, small.wt.w), small.acc.to(torch.float32).to(torch.bfloat16).to(torch.float32))


def test_f7_wraps_to_int16():
    case = make_case(8, k=512)
    run = inject(VARIANT_BY_ID["F7.all"], case)
    exact = accumulate_int64(case.act.a, case.wt.w)
    assert torch.equal(run.acc.to(torch.int64), (exact + 2**15) % 2**16 - 2**15)
    assert int(run.acc.min()) >= -(2**15) and int(run.acc.max()) < 2**15
    assert torch.equal(wrap_int16(torch.tensor([32767, 32768, -32769, 65536])), torch.tensor([32767, -32768, 32767, 0], dtype=torch.int32))


def test_f8_is_the_reference():
    case = make_case(9)
    run = inject(VARIANT_BY_ID["F8.all"], case)
    assert bitwise_equal(run.y, case.ref.y) and run.act is case.act and run.acc is case.acc


def test_f9_operand_faults():
    case = make_case(10, m=50, k=200, n=30)
    a = inject(VARIANT_BY_ID["F9.one"], case)
    assert torch.equal(a.act.a, case.act.a) and a.acc is case.acc
    diff = (a.act.s_a != case.act.s_a).reshape(-1)
    assert int(diff.sum()) == 1
    row = int(diff.nonzero()[0, 0])
    assert float(a.act.s_a[row]) == float(torch.tensor(float(case.act.s_a[row])) * F9A_FACTOR)
    b = inject(VARIANT_BY_ID["F9.1pct"], case)
    d = (b.act.a.to(torch.int16) - case.act.a.to(torch.int16)).abs()
    assert int(d.max()) == 1 and 0 < int(d.sum()) <= math.ceil(0.01 * 50 * 200)
    assert torch.equal(b.acc.to(torch.int64), accumulate_int64(b.act.a, case.wt.w))
    c = inject(VARIANT_BY_ID["F9.all"], case)
    assert bool(((c.act.a.to(torch.int16) - case.act.a.to(torch.int16)).abs() == 1).all())
    assert bitwise_equal(c.y, epilogue_triton_order(c.acc, c.act.s_a, case.wt.s_w))


def test_shift_int8_by_one_saturates_at_the_top():
    x = torch.tensor([-128, -1, 0, 126, 127], dtype=torch.int8)
    assert torch.equal(shift_int8_by_one(x), torch.tensor([-127, 0, 1, 127, 126], dtype=torch.int8))


def test_severity_masks():
    """one: exactly one element, drawn from those the fault changes; 1pct: at most
    ceil(1% of M*N) elements; all: None (every element); anything else is refused."""
    from requant.audit.faults import severity_mask

    y_ref = torch.zeros(20, 30, dtype=torch.bfloat16)
    y_fault = y_ref.clone()
    y_fault[7, 11] = 1.0  # the only element the fault changes
    one = severity_mask("one", y_fault, y_ref, torch.Generator().manual_seed(0))
    assert one.dtype == torch.bool and int(one.sum()) == 1 and bool(one[7, 11])
    pct = severity_mask("1pct", y_fault, y_ref, torch.Generator().manual_seed(0))
    assert 1 <= int(pct.sum()) <= 6  # ceil(0.01 * 600) draws, duplicates collapse
    assert severity_mask("all", y_fault, y_ref, torch.Generator()) is None
    with pytest.raises(ValueError):
        severity_mask("half", y_fault, y_ref, torch.Generator())
