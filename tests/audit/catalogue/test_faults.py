"""audit/catalogue/faults.py against independent references. Bitwise assertions only.

The faulty epilogues (F1-F5), the reference pipeline and F9's output are checked against
numpy float32 arithmetic done step by step (each numpy float32 multiply or divide is one
IEEE round-to-nearest-even operation, computed apart from torch) with the bf16 rounding
done by integer arithmetic on the float32 bits (tests/kernels/bf16_ref.py), on an
accumulator recomputed with numpy int64 matmul: nothing here compares a fault with the
requant.kernels function it calls. Accumulator faults (F6, F7) are checked against
torch's cast and modular integer arithmetic."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from requant.audit.catalogue.faults import (
    F9A_FACTOR,
    VARIANT_BY_ID,
    VARIANTS,
    accumulate_bf16_tiles,
    inject,
    reference_case,
    shift_int8_by_one,
    wrap_int16,
)
from requant.audit.records import Activations, Weights
from requant.kernels.bf16 import bitwise_equal, ulp_distance
from requant.kernels.reference import accumulate_int64
from tests.audit.conftest import make_case
from tests.kernels.bf16_ref import bf16_to_f32, f32_bits, ref_round, ref_truncate, torch_bf16


def np_acc(a: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    """The exact accumulator, numpy int64 (products <= 2^14, sums far below 2^63)."""
    return a.numpy().astype(np.int64) @ w.numpy().astype(np.int64).T


def np_epilogue(kind: str, acc: np.ndarray, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N] of one epilogue, in numpy float32 step by step; fp32(acc) is numpy's
    int -> float32 conversion (round to nearest even)."""
    acc32 = acc.astype(np.float32)
    sa = s_a.numpy().astype(np.float32).reshape(-1, 1)
    sw = s_w.numpy().astype(np.float32).reshape(1, -1)
    if kind == "triton":  # the reference: bf16(fp32(s_a * acc) * s_w)
        bits = ref_round(f32_bits((sa * acc32) * sw))
    elif kind == "F1":  # s_w through an fp32 reciprocal: bf16(fp32(s_a * acc) / fp32(1 / s_w))
        bits = ref_round(f32_bits((sa * acc32) / (np.float32(1) / sw)))
    elif kind == "F2":  # bf16 after s_a, then * s_w and bf16 again
        bits = ref_round(f32_bits(bf16_to_f32(ref_round(f32_bits(sa * acc32))) * sw))
    elif kind == "F3":  # CUTLASS order: bf16(s_a * fp32(s_w * acc))
        bits = ref_round(f32_bits(sa * (sw * acc32)))
    elif kind == "F4":  # truncating final cast
        bits = ref_truncate(f32_bits((sa * acc32) * sw))
    elif kind == "F5":  # bf16(acc * fp32(s_a * s_w))
        bits = ref_round(f32_bits(acc32 * (sa * sw)))
    else:
        raise ValueError(kind)
    return torch_bf16(bits)


EPILOGUE = ("F1", "F2", "F3", "F4", "F5")


def changed(y, ref):
    return int((y.view(torch.int16) != ref.view(torch.int16)).sum())


def test_catalogue_shape():
    assert len(VARIANTS) == 21
    fams = [v.family for v in VARIANTS]
    assert {f: fams.count(f) for f in set(fams)} == {
        "F1": 3,
        "F2": 3,
        "F3": 3,
        "F4": 3,
        "F5": 3,
        "F6": 1,
        "F7": 1,
        "F8": 1,
        "F9": 3,
    }
    assert len({v.id for v in VARIANTS}) == 21


def test_reference_case_is_the_triton_order():
    case = make_case(1)
    acc = np_acc(case.act.a, case.wt.w)
    assert torch.equal(case.acc.to(torch.int64), torch.from_numpy(acc))
    assert torch.equal(case.acc.to(torch.int64), accumulate_int64(case.act.a, case.wt.w))
    assert bitwise_equal(case.ref.y, np_epilogue("triton", acc, case.act.s_a, case.wt.s_w))


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_epilogue_faults_commute_under_pow2_except_f4(seed):
    """F1, F2, F3, F5 give the reference bits when every s_w is a power of two; F4 does not."""
    case = make_case(seed, pow2=True)
    for fam in ("F1", "F2", "F3", "F5"):
        run = inject(VARIANT_BY_ID[f"{fam}.all"], case)
        assert bitwise_equal(run.y, case.ref.y), fam
    f4 = inject(VARIANT_BY_ID["F4.all"], case)
    assert bitwise_equal(f4.y, np_epilogue("F4", np_acc(case.act.a, case.wt.w), case.act.s_a, case.wt.s_w))
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


def crafted_case(seed: int, hits: int = 3):
    """A case on which every epilogue fault changes some output. F1, F3 and F5 move an
    output on a few per million random operands, so candidates (s_a, acc) are drawn in
    bulk for one bf16 s_w and those whose bf16 output differs from the reference order (by
    the numpy pipelines) are kept, `hits` per fault; each becomes a row whose int8
    activations sum to that acc (K = 2048, w = ones: acc = the row sum)."""
    rng = np.random.default_rng(seed)
    s_w = torch.tensor([[0.0037]]).to(torch.bfloat16).to(torch.float32)
    s_w.numpy()
    sa = (rng.random(2_000_000) * 0.05 + 1e-3).astype(np.float32)
    acc = rng.integers(-200_000, 200_000, sa.size)
    ref = np_epilogue("triton", acc[:, None], torch.from_numpy(sa), s_w).view(torch.int16)
    rows = []
    for fam in ("F1", "F3", "F5"):
        y = np_epilogue(fam, acc[:, None], torch.from_numpy(sa), s_w).view(torch.int16)
        rows += (y != ref).reshape(-1).nonzero().reshape(-1)[:hits].tolist()
    k = 2048
    base = acc[rows] // k  # floor: each row is `rem` values base + 1 and k - rem values base
    rem = acc[rows] - base * k
    a = base[:, None] + (np.arange(k)[None, :] < rem[:, None])
    assert a.min() >= -128 and a.max() <= 127 and np.array_equal(a.sum(1), acc[rows])
    act = Activations(torch.from_numpy(a.astype(np.int8)), torch.from_numpy(sa[rows]).reshape(-1, 1))
    return reference_case("crafted", "native", act, Weights(torch.ones(1, k, dtype=torch.int8), s_w))


@pytest.mark.parametrize("kind", ["random", "pow2", "crafted"])
def test_epilogue_faults_against_numpy(kind):
    """F1-F5 at severity all, bit for bit against the numpy float32 pipelines above (F3 is
    the CUTLASS order, F4 truncates): on random operands with general and power-of-two
    weight scales, and on a crafted case where each fault changes some output (so that a
    fault equal to the reference could not pass)."""
    case = crafted_case(0) if kind == "crafted" else make_case(7, pow2=kind == "pow2", m=40, k=160, n=48)
    acc = np_acc(case.act.a, case.wt.w)
    for fam in ("F1", "F2", "F3", "F4", "F5"):
        want = np_epilogue(fam, acc, case.act.s_a, case.wt.s_w)
        assert bitwise_equal(inject(VARIANT_BY_ID[f"{fam}.all"], case).y, want), fam
        if kind == "crafted":
            assert not bitwise_equal(want, case.ref.y), fam


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
    assert torch.equal(
        accumulate_bf16_tiles(small.act.a, small.wt.w), small.acc.to(torch.float32).to(torch.bfloat16).to(torch.float32)
    )


def test_f7_wraps_to_int16():
    case = make_case(8, k=512)
    run = inject(VARIANT_BY_ID["F7.all"], case)
    exact = accumulate_int64(case.act.a, case.wt.w)
    assert torch.equal(run.acc.to(torch.int64), (exact + 2**15) % 2**16 - 2**15)
    assert int(run.acc.min()) >= -(2**15) and int(run.acc.max()) < 2**15
    assert torch.equal(
        wrap_int16(torch.tensor([32767, 32768, -32769, 65536])),
        torch.tensor([32767, -32768, 32767, 0], dtype=torch.int32),
    )


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
    a = case.act.a.numpy().astype(np.int64)
    shifted = np.where(a == 127, 126, a + 1)  # the documented shift, restated
    assert np.array_equal(c.act.a.numpy(), shifted)
    acc = shifted @ case.wt.w.numpy().astype(np.int64).T
    assert np.array_equal(c.acc.numpy(), acc)
    assert bitwise_equal(c.y, np_epilogue("triton", acc, case.act.s_a, case.wt.s_w))


def test_shift_int8_by_one_saturates_at_the_top():
    x = torch.tensor([-128, -1, 0, 126, 127], dtype=torch.int8)
    assert torch.equal(shift_int8_by_one(x), torch.tensor([-127, 0, 1, 127, 126], dtype=torch.int8))


def test_severity_masks():
    """one: exactly one element, drawn from those the fault changes; 1pct: at most
    ceil(1% of M*N) elements; all: None (every element); anything else is refused."""
    from requant.audit.catalogue.faults import severity_mask

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
