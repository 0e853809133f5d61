"""The fault catalogue: 9 families, 21 variants, each a modification of one exact reference pipeline.

    acc = exact int32 accumulator                      (kernels.reference.accumulate)
    y   = bf16_rne(fp32(fp32(s_a * fp32(acc)) * s_w))  (kernels.reference.epilogue_triton_order)

Contract: inject(variant, reference_case(...)) returns a *run under test* (audit.records.Run):
the operands it consumed, the accumulator it formed, the bf16 output and a kernel description;
audit/catalogue/checks.py compares it with the reference run. Faults are seeded (seed_for): the same
layer, regime and variant always give the same run.

Severities, families and why each fault moves what it moves: docs/audit.md#fault-definitions.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from requant.audit.records import REFERENCE_KERNEL, Activations, KernelDesc, Run, Weights
from requant.kernels.bf16 import round_fp32_to_bf16, truncate_fp32_to_bf16
from requant.kernels.reference import accumulate, epilogue_cutlass_order, epilogue_triton_order, scale_row

F6_TILE = 64
F9A_FACTOR = 1.25
SEVERITIES = ("one", "1pct", "all")


@dataclass(frozen=True)
class Variant:
    id: str  # "F1.one", ..., "F9.all"
    family: str  # "F1".."F9"
    severity: str  # "one" | "1pct" | "all"
    title: str


FAMILY_TITLES = {
    "F1": "scale precision (fp32 reciprocal of s_w)",
    "F2": "double rounding (bf16 after the first scale)",
    "F3": "multiplication order (CUTLASS order)",
    "F4": "output truncation (round toward zero)",
    "F5": "fused ordering (acc * fp32(s_a*s_w))",
    "F6": "accumulator precision (bf16 accumulator)",
    "F7": "accumulator range (int16 wrap)",
    "F8": "null fault",
    "F9": "operand fault (activations the reference did not use)",
}
_SEVERITIES_OF = {f: SEVERITIES for f in ("F1", "F2", "F3", "F4", "F5", "F9")} | {
    "F6": ("all",),
    "F7": ("all",),
    "F8": ("all",),
}

VARIANTS: tuple[Variant, ...] = tuple(
    Variant(f"{fam}.{sev}", fam, sev, FAMILY_TITLES[fam]) for fam in FAMILY_TITLES for sev in _SEVERITIES_OF[fam]
)
VARIANT_BY_ID = {v.id: v for v in VARIANTS}
assert len(VARIANTS) == 21

# Each fault kernel declares the order of the pipeline it modifies (the reference's Triton
# order): a fault is a kernel that deviates from what it claims (check C8).
FAULT_KERNELS = {
    "F1": KernelDesc(
        "F1 reciprocal scale", "int", 32, "triton-order, s_w via fp32 reciprocal", declares="triton-order"
    ),
    "F2": KernelDesc("F2 double rounding", "int", 32, "triton-order, bf16 after s_a", declares="triton-order"),
    "F3": KernelDesc("F3 cutlass order", "int", 32, "cutlass-order", declares="triton-order"),
    "F4": KernelDesc("F4 truncation", "int", 32, "triton-order, truncating cast", declares="triton-order"),
    "F5": KernelDesc("F5 fused scales", "int", 32, "acc * fp32(s_a*s_w)", declares="triton-order"),
    "F6": KernelDesc("F6 bf16 accumulator", "float", 8, "triton-order"),
    "F7": KernelDesc("F7 int16 accumulator", "int", 16, "triton-order"),
    "F8": REFERENCE_KERNEL,
    "F9": REFERENCE_KERNEL,
}


@dataclass
class LayerCase:
    """One (layer, regime): shared operands, the exact accumulator and the reference run.

    `cache` keeps the full faulty output of each family so that its three severities
    (and nothing else) are derived from one computation.
    """

    name: str
    regime: str
    act: Activations
    wt: Weights
    acc: torch.Tensor
    ref: Run
    cache: dict = field(default_factory=dict)
    # How exact accumulators are formed (F9b/F9c) and F6's: the definitions by default; a caller
    # may pass exact equivalents (audit/device_acc.py: torch._int_mm, the Triton F6 kernel).
    acc_fn: Callable = accumulate
    f6_fn: Callable | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        m, k = self.act.a.shape
        return m, k, self.wt.w.shape[0]


def reference_case(
    name: str, regime: str, act: Activations, wt: Weights, acc_fn: Callable = accumulate, f6_fn=None
) -> LayerCase:
    """The exact reference pipeline on shared operands (accumulator computed once)."""
    acc = acc_fn(act.a, wt.w)
    y = epilogue_triton_order(acc, act.s_a, wt.s_w)
    return LayerCase(name, regime, act, wt, acc, Run(act, wt, acc, y, REFERENCE_KERNEL), acc_fn=acc_fn, f6_fn=f6_fn)


def seed_for(*parts: str) -> int:
    """A stable seed from names (crc32; independent of Python's hash randomization)."""
    return zlib.crc32("|".join(parts).encode())


def _generator(case: LayerCase, variant_id: str) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed_for(case.name, case.regime, variant_id))


def _changed(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16) != ref.view(torch.int16)


def severity_mask(
    severity: str, y_fault: torch.Tensor, y_ref: torch.Tensor, gen: torch.Generator
) -> torch.Tensor | None:
    """Boolean [M, N] mask of the elements the fault replaces (None = all)."""
    if severity == "all":
        return None
    m, n = y_ref.shape
    mask = torch.zeros(m * n, dtype=torch.bool, device=y_ref.device)
    if m * n == 0:
        return mask.view(m, n)
    if severity == "one":
        changed = _changed(y_fault, y_ref).reshape(-1).nonzero().reshape(-1)
        if changed.numel():
            pick = int(torch.randint(0, changed.numel(), (1,), generator=gen))
            mask[changed[pick]] = True
        else:
            mask[int(torch.randint(0, m * n, (1,), generator=gen))] = True
        return mask.view(m, n)
    if severity == "1pct":
        idx = torch.randint(0, m * n, (math.ceil(0.01 * m * n),), generator=gen)
        mask[idx.to(y_ref.device)] = True
        return mask.view(m, n)
    raise ValueError(f"unknown severity {severity!r}")


def _inner(case: LayerCase) -> torch.Tensor:
    """fp32(s_a * fp32(acc)): the first product of the Triton order."""
    if "inner" not in case.cache:
        case.cache["inner"] = case.act.s_a.reshape(-1, 1) * case.acc.to(torch.float32)
    return case.cache["inner"]


def _f1(case: LayerCase) -> torch.Tensor:
    recip = 1.0 / scale_row(case.wt.s_w)  # precomputed fp32 reciprocal per channel
    return round_fp32_to_bf16(_inner(case) / recip)


def _f2(case: LayerCase) -> torch.Tensor:
    first = round_fp32_to_bf16(_inner(case)).to(torch.float32)
    return round_fp32_to_bf16(first * scale_row(case.wt.s_w))


def _f3(case: LayerCase) -> torch.Tensor:
    return epilogue_cutlass_order(case.acc, case.act.s_a, case.wt.s_w)


def _f4(case: LayerCase) -> torch.Tensor:
    return truncate_fp32_to_bf16(_inner(case) * scale_row(case.wt.s_w))


def _f5(case: LayerCase) -> torch.Tensor:
    scale = case.act.s_a.reshape(-1, 1) * scale_row(case.wt.s_w)
    return round_fp32_to_bf16(case.acc.to(torch.float32) * scale)


_EPILOGUE_FAULTS = {"F1": _f1, "F2": _f2, "F3": _f3, "F4": _f4, "F5": _f5}


def accumulate_bf16_tiles(a: torch.Tensor, w: torch.Tensor, tile: int = F6_TILE) -> torch.Tensor:
    """F6's accumulator: exact tile sums added into a bf16 register (returned as fp32)."""
    m, k = a.shape
    n = w.shape[0]
    pad = (-k) % tile  # zero columns add nothing
    a64 = torch.nn.functional.pad(a.to(torch.float64), (0, pad)).view(m, -1, tile).transpose(0, 1)
    w64 = torch.nn.functional.pad(w.to(torch.float64), (0, pad)).view(n, -1, tile).transpose(0, 1)
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for a_t, w_t in zip(a64, w64):  # one [M, N] tile sum at a time: memory stays O(M*N)
        part = (a_t @ w_t.T).to(torch.float32)  # exact: |part| <= tile * 2**14 <= 2**20
        # fp32 add, then torch's fp32 -> bf16 cast (round half to even on CPU and GPU)
        acc = (acc + part).to(torch.bfloat16).to(torch.float32)
    return acc


def wrap_int16(acc: torch.Tensor) -> torch.Tensor:
    """F7's accumulator: the exact accumulator wrapped to int16 (two's complement)."""
    a = acc.to(torch.int64)
    return (torch.remainder(a + 2**15, 2**16) - 2**15).to(torch.int32)


def shift_int8_by_one(a: torch.Tensor) -> torch.Tensor:
    """+1, except 127 -> 126: every element changes by exactly one and stays int8."""
    a16 = a.to(torch.int16)
    return torch.where(a16 == 127, a16 - 1, a16 + 1).to(torch.int8)


def _operand_fault(case: LayerCase, severity: str, gen: torch.Generator) -> Run:
    a, s_a, wt = case.act.a, case.act.s_a, case.wt
    if severity == "one":  # F9a: one activation scale
        nonzero = (s_a.reshape(-1) != 0).nonzero().reshape(-1)
        rows = nonzero if nonzero.numel() else torch.arange(s_a.shape[0], device=s_a.device)
        row = int(rows[int(torch.randint(0, rows.numel(), (1,), generator=gen))])
        s_new = s_a.clone()
        s_new[row] = s_new[row] * F9A_FACTOR
        act = Activations(a, s_new)
        acc = case.acc  # the int8 tensors are untouched, so is the accumulator
    elif severity == "1pct":  # F9b: 1% of int8 activations shifted by one
        flat = a.reshape(-1).clone()
        idx = torch.unique(torch.randint(0, flat.numel(), (math.ceil(0.01 * flat.numel()),), generator=gen)).to(
            a.device
        )
        flat[idx] = shift_int8_by_one(flat[idx])
        act = Activations(flat.view_as(a), s_a)
        acc = case.acc_fn(act.a, wt.w)
    elif severity == "all":  # F9c: every int8 activation shifted by one
        act = Activations(shift_int8_by_one(a), s_a)
        acc = case.acc_fn(act.a, wt.w)
    else:
        raise ValueError(f"unknown severity {severity!r}")
    y = epilogue_triton_order(acc, act.s_a, wt.s_w)
    return Run(act, wt, acc, y, FAULT_KERNELS["F9"])


def inject(variant: Variant, case: LayerCase) -> Run:
    """The run under test for one fault variant on one (layer, regime)."""
    fam = variant.family
    gen = _generator(case, variant.id)
    ref = case.ref
    if fam in _EPILOGUE_FAULTS:
        if fam not in case.cache:
            case.cache[fam] = _EPILOGUE_FAULTS[fam](case)
        y_fault = case.cache[fam]
        mask = severity_mask(variant.severity, y_fault, ref.y, gen)
        y = y_fault if mask is None else torch.where(mask, y_fault, ref.y)
        return Run(case.act, case.wt, case.acc, y, FAULT_KERNELS[fam])
    if fam == "F6":
        acc = (case.f6_fn or accumulate_bf16_tiles)(case.act.a, case.wt.w)
        return Run(case.act, case.wt, acc, epilogue_triton_order(acc, case.act.s_a, case.wt.s_w), FAULT_KERNELS[fam])
    if fam == "F7":
        acc = wrap_int16(case.acc)
        return Run(case.act, case.wt, acc, epilogue_triton_order(acc, case.act.s_a, case.wt.s_w), FAULT_KERNELS[fam])
    if fam == "F8":
        y = epilogue_triton_order(case.acc, case.act.s_a, case.wt.s_w)
        return Run(case.act, case.wt, case.acc, y, FAULT_KERNELS[fam])
    if fam == "F9":
        return _operand_fault(case, variant.severity, gen)
    raise ValueError(f"unknown fault family {fam!r}")
