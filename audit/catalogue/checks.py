"""The checks C1..C8. Each is a pure function of (reference run, run under test, kernel
description of the run under test) and returns a CheckResult: whether it is applicable
(recorded apart from the verdict) and, if so, whether it fires.

  C1 shared activation operands   C5 power-of-two identity
  C2 shared weight operands       C6 real-scale tolerance (one bf16 spacing)
  C3 accumulator exactness        C7 token-level risk (end to end: runs carrying logits)
     precondition                 C8 declared-order identity
  C4 exact accumulator

Matrix v1 (prediction_matrix.json) scores C1..C7 (CHECK_IDS); matrix v2 adds C8
(ALL_CHECK_IDS). run_checks runs the checks a matrix names, so a v1 run is unchanged.

Each check's definition, and why C5, C6 and C8 all exist: docs/audit.md#fault-definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from requant.audit.records import KernelDesc, Run, output_distance, output_equal
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.reference import (
    accumulate,
    epilogue_cutlass_order,
    epilogue_exact,
    epilogue_fused_order,
    epilogue_triton_order,
)

FIRE = "fire"
SILENT = "silent"
NOT_APPLICABLE = "not_applicable"
CHECK_IDS = ("C1", "C2", "C3", "C4", "C5", "C6", "C7")
LAYER_CHECK_IDS = CHECK_IDS[:6]
ALL_CHECK_IDS = CHECK_IDS + ("C8",)

# The emulation of each order a kernel may declare (records.KNOWN_ORDERS).
ORDER_EPILOGUES = {
    "cutlass-order": epilogue_cutlass_order,
    "triton-order": epilogue_triton_order,
    "fused-order": epilogue_fused_order,
    "exact": epilogue_exact,
}

CHECK_TITLES = {
    "C1": "shared activation operands",
    "C2": "shared weight operands",
    "C3": "accumulator exactness precondition",
    "C4": "exact accumulator",
    "C5": "power-of-two identity",
    "C6": "real-scale tolerance (<= 1 spacing)",
    "C7": "token-level risk (end-to-end)",
    "C8": "declared-order identity",
}


@dataclass(frozen=True)
class CheckResult:
    check: str
    applicable: bool
    fired: bool | None  # None when not applicable
    detail: str = ""

    @property
    def outcome(self) -> str:
        if not self.applicable:
            return NOT_APPLICABLE
        return FIRE if self.fired else SILENT


def _na(check: str, why: str) -> CheckResult:
    return CheckResult(check, False, None, why)


def _verdict(check: str, fired: bool, detail: str = "") -> CheckResult:
    return CheckResult(check, True, bool(fired), detail)


def c1_shared_activations(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.act is None or test.act is None:
        return _na("C1", "no activation operands recorded")
    return _verdict("C1", ref.act.digest() != test.act.digest())


def c2_shared_weights(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.wt is None or test.wt is None:
        return _na("C2", "no weight operands recorded")
    return _verdict("C2", ref.wt.digest() != test.wt.digest())


def c3_accumulator_precondition(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if test.act is None:
        return _na("C3", "no operands: K unknown")
    k = test.act.a.shape[1]
    need = k * 128 * 128
    return _verdict(
        "C3",
        need > kernel.exact_integer_bound(),
        f"K*2**14={need}, {kernel.acc_kind}{kernel.acc_bits} holds {kernel.exact_integer_bound()}",
    )


def c4_exact_accumulator(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.acc is None or test.acc is None or not kernel.exposes_acc:
        return _na("C4", "kernel exposes no accumulator")
    if ref.acc.shape != test.acc.shape:
        return _verdict("C4", True, "accumulator shape differs")
    # float64 holds every int32 and every bf16/fp32 accumulator value exactly.
    return _verdict("C4", not torch.equal(ref.acc.to(torch.float64), test.acc.to(torch.float64)))


def c5_power_of_two_identity(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.wt is None or not ref.wt.all_scales_power_of_two():
        return _na("C5", "not every weight scale is a power of two")
    if ref.y.shape != test.y.shape or ref.y.dtype != test.y.dtype:
        return _verdict("C5", True, "output shape or dtype differs")
    return _verdict("C5", not output_equal(ref, test))


def c6_tolerance(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.y is None or test.y is None:
        return _na("C6", "no outputs")
    if ref.y.shape != test.y.shape:
        return _verdict("C6", True, "output shape differs")
    if ref.y.numel() == 0 or output_equal(ref, test):
        return _verdict("C6", False, "max 0 spacings")
    worst = int(output_distance(ref, test).max())
    return _verdict("C6", worst > 1, f"max {worst} spacings")


def token_risk(ref_logits: torch.Tensor, test_logits: torch.Tensor) -> dict:
    """Per-token margin vs deviation, the arithmetic behind C7 (logits [T, V], any float)."""
    r = ref_logits.to(torch.float64)
    t = test_logits.to(torch.float64)
    top2 = torch.topk(r, 2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    deviation = (r - t).abs().amax(dim=-1)
    # The rule (margin < deviation) alone misses a flip whose margin lies in
    # [deviation, 2*deviation): the top logit may fall and the runner-up rise by up to
    # `deviation` each. A token whose top-1 actually changed is flagged as well.
    flipped = r.argmax(-1) != t.argmax(-1)
    flagged = (margin < deviation) | flipped
    return {
        "tokens": int(r.shape[0]),
        "flagged": int(flagged.sum()),
        "top1_disagreements": int(flipped.sum()),
        "max_deviation": float(deviation.max()) if r.shape[0] else 0.0,
        "min_margin": float(margin.min()) if r.shape[0] else 0.0,
        "bitwise_equal": bitwise_equal(ref_logits, test_logits),
    }


def c7_token_risk(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    if ref.logits is None or test.logits is None:
        return _na("C7", "no logits: per-layer cell")
    risk = token_risk(ref.logits, test.logits)
    return _verdict("C7", risk["flagged"] > 0, f"{risk['flagged']}/{risk['tokens']} tokens flagged")


def declared_output(ref: Run | None, test: Run, order: str):
    """The declared order's output on the run's own operands (exact int32 accumulator).

    When the run shares the reference run's operand tensors (every epilogue and accumulator
    fault does), the reference's exact accumulator is reused and the result memoized on the
    reference run; otherwise (operand faults) the accumulator is recomputed from the run's
    int8 tensors, never taken from the run itself.
    """
    act, wt = test.act, test.wt
    shared = (
        ref is not None
        and ref.act is not None
        and ref.wt is not None
        and ref.acc is not None
        and act.a is ref.act.a
        and wt.w is ref.wt.w
        and ref.acc.dtype == torch.int32
    )
    if shared and act.s_a is ref.act.s_a and wt.s_w is ref.wt.s_w:
        key = ("declared", order)
        if key not in ref.memo:
            ref.memo[key] = ORDER_EPILOGUES[order](ref.acc, act.s_a, wt.s_w)
        return ref.memo[key]
    acc = ref.acc if shared else accumulate(act.a, wt.w)
    return ORDER_EPILOGUES[order](acc, act.s_a, wt.s_w)


def c8_declared_order(ref: Run, test: Run, kernel: KernelDesc) -> CheckResult:
    order = kernel.declared_order
    if order is None:
        return _na("C8", f"the kernel declares no known epilogue order ({kernel.epilogue!r})")
    if test.act is None or test.wt is None or test.y is None:
        return _na("C8", "no operands or output recorded")
    want = declared_output(ref, test, order)
    if want.shape != test.y.shape or want.dtype != test.y.dtype:
        return _verdict("C8", True, "output shape or dtype differs")
    if bitwise_equal(want, test.y):
        return _verdict("C8", False, f"bitwise equal to the {order} emulation")
    n = int((want.view(torch.int16) != test.y.view(torch.int16)).sum())
    return _verdict("C8", True, f"{n} elements differ from the {order} emulation")


CHECKS = {
    "C1": c1_shared_activations,
    "C2": c2_shared_weights,
    "C3": c3_accumulator_precondition,
    "C4": c4_exact_accumulator,
    "C5": c5_power_of_two_identity,
    "C6": c6_tolerance,
    "C7": c7_token_risk,
    "C8": c8_declared_order,
}


def run_checks(ref: Run, test: Run, kernel: KernelDesc | None = None, checks=CHECK_IDS) -> dict[str, CheckResult]:
    """The named checks (default the seven of matrix v1) on one (reference, under test) pair."""
    kernel = kernel or test.kernel
    return {cid: CHECKS[cid](ref, test, kernel) for cid in checks}
