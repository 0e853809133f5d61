"""The injection's fault kernels: audit/conform/fault_kernels.py's eleven, bit for bit, built for a
model that calls them once per Linear and step.

What the catalogue's kernels repeat on every call and these do not:
  * the reference output (reference_case forms it; none of these variants reads it);
  * the bf16 cast, a dozen elementwise operations, once per block: `last` gives the fp32 value a
    variant casts, and the injector casts every faulted block of a Linear at once;
  * the exact accumulator, when the caller has it: `from_acc` takes it (the injector forms one for
    every faulted block of a Linear at once, audit/phases/injection.py);
  * F9a's and F9b's seeded draws. Their generator is seeded by the variant alone, so the draw
    depends on the shape: F9b's flat indices on M*K, F9a's row on M and the count of non-zero
    scales. Each is made once per shape on the host and kept on the device, and F9a's row is
    picked there from the count: no host synchronisation per call (the catalogue's nonzero(),
    int() and unique() each wait for the device).
"""

from __future__ import annotations

import math

import torch

from requant.audit.catalogue.faults import (
    F9A_FACTOR,
    VARIANT_BY_ID,
    accumulate_bf16_tiles,
    seed_for,
    shift_int8_by_one,
    wrap_int16,
)
from requant.audit.conform.fault_kernels import FAULTS
from requant.audit.device_acc import exact_accumulate
from requant.audit.f6_tiles import f6_accumulator
from requant.kernels.bf16 import round_fp32_to_bf16, truncate_fp32_to_bf16
from requant.kernels.reference import accumulate, check_operands

__all__ = ["VARIANT_OF", "LeanFault", "device_faults", "lean_epilogue", "lean_faults"]

# The variant each kernel of audit/conform/fault_kernels.py runs (FAULTS' names).
VARIANT_OF = {f"F{i}": f"F{i}.all" for i in range(1, 9)} | {"F9a": "F9.one", "F9b": "F9.1pct", "F9c": "F9.all"}
_CASE = ("conform", "native")  # the name and regime fault_kernels' reference_case seeds the draws with


def device_faults(device) -> dict:
    """The eleven kernels with exact accumulators suited to the device: on CUDA cuBLASLt's int8 GEMM
    and F6's Triton kernel (audit/device_acc.py, audit/f6_tiles.py), elsewhere the float64
    definition and F6's torch tile loop. The same bits: every accumulator is the exact integer
    (F6: the same bf16 register, tile by tile)."""
    if torch.device(device).type == "cuda":
        return lean_faults(exact_accumulate, f6_accumulator)
    return lean_faults(accumulate, accumulate_bf16_tiles)


def lean_faults(acc_fn, f6_fn) -> dict:
    """{FAULT: LeanFault} on the given accumulators, sharing one cache of draws."""
    draws = _Draws()
    return {f: LeanFault(VARIANT_BY_ID[VARIANT_OF[f]], acc_fn, f6_fn, draws) for f in FAULTS}


def _inner(acc, s_a):
    return s_a.reshape(-1, 1) * acc.to(torch.float32)  # fp32(s_a * fp32(acc)): the Triton order's first product


# Each variant's last fp32 value before its one bf16 cast, written from audit/catalogue/faults.py's formulas
# (the same operations in the same order; test_lean_faults compares the bits with the catalogue):
# (acc, s_a, s_w) -> fp32 [M, N]. F4 truncates that value; every other variant rounds it (RNE).
_LAST = {
    "F1": lambda acc, s_a, s_w: _inner(acc, s_a) / (1.0 / s_w.reshape(1, -1)),
    "F2": lambda acc, s_a, s_w: round_fp32_to_bf16(_inner(acc, s_a)).to(torch.float32) * s_w.reshape(1, -1),
    "F3": lambda acc, s_a, s_w: s_a.reshape(-1, 1) * (s_w.reshape(1, -1) * acc.to(torch.float32)),
    "F5": lambda acc, s_a, s_w: acc.to(torch.float32) * (s_a.reshape(-1, 1) * s_w.reshape(1, -1)),
}


def lean_epilogue(acc, s_a, s_w):
    """The Triton order's fp32 value before its cast, fp32(fp32(s_a * fp32(acc)) * s_w): F4's and
    F6..F9's last step (each on its own accumulator or scales, see LeanFault.last_operands)."""
    return _inner(acc, s_a) * s_w.reshape(1, -1)


class LeanFault:
    """fn(a, w, s_a, s_w) -> bf16 [M, N]: one variant at severity `all` (F9: its operand fault);
    from_acc(a, w, s_a, s_w, acc) the same, given a's exact accumulator acc; last(...) the fp32
    value it casts last and whether it truncates (the injector casts several blocks at once)."""

    # Each output element reads its own weight row and scale only (exact or F6 per-element
    # accumulators, elementwise epilogues, F9's draws made from a alone): the injector may stack
    # several Linears of one input along N (FaultInjector.shared_input).
    columnwise = True

    def __init__(self, variant, acc_fn, f6_fn, draws):
        assert variant.severity == "all" or variant.family == "F9", variant.id
        self.variant, self.acc_fn, self.f6_fn, self.draws = variant, acc_fn, f6_fn, draws
        self.truncates = variant.family == "F4"
        self.__name__ = variant.id.replace(".", "_")

    def __call__(self, a, w, s_a, s_w):
        check_operands(a, w, s_a, s_w)
        return self.from_acc(a, w, s_a, s_w, self.acc_fn(a, w))

    def from_acc(self, a, w, s_a, s_w, acc):
        return (truncate_fp32_to_bf16 if self.truncates else round_fp32_to_bf16)(self.last(a, w, s_a, s_w, acc))

    def last(self, a, w, s_a, s_w, acc):
        """The fp32 value this variant casts to bf16 last (module _LAST), given a's exact accumulator."""
        if self.variant.family in _LAST:
            return _LAST[self.variant.family](acc, s_a, s_w)
        return lean_epilogue(*self.last_operands(a, w, s_a, s_w, acc), s_w)

    def last_operands(self, a, w, s_a, s_w, acc):
        """(accumulator, s_a) of the Triton-order epilogue this variant ends with (F4, F6..F9: `last`
        is lean_epilogue of them), or None for F1, F2, F3, F5 (their own epilogues). The injector runs one
        epilogue for every faulted block that ends with it (elementwise: the same bits)."""
        fam, vid = self.variant.family, self.variant.id
        if fam in _LAST:
            return None
        if fam == "F6":
            acc = self.f6_fn(a, w)
        elif fam == "F7":
            acc = wrap_int16(acc)
        elif vid == "F9.one":  # the accumulator is untouched: one scale changes
            s_a = self.draws.f9a_scales(s_a)
        elif vid == "F9.1pct":
            acc = self.acc_fn(self.draws.f9b_operand(a), w)
        elif vid == "F9.all":
            acc = self.acc_fn(shift_int8_by_one(a), w)
        return acc, s_a


class _Draws:
    """F9a's and F9b's seeded draws per shape, on the device (module docstring)."""

    def __init__(self):
        self.cache: dict = {}

    @staticmethod
    def _gen(variant_id: str) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(seed_for(*_CASE, variant_id))

    def f9a_scales(self, s_a: torch.Tensor) -> torch.Tensor:
        """s_a with one row times F9A_FACTOR: the catalogue draws randint(0, c) on a fresh generator,
        c the count of rows with a non-zero scale (all M rows when none), and takes that row of
        them. The draw for every c in 1..M is tabled once; the row is chosen on the device."""
        m, dev = s_a.shape[0], s_a.device
        key = ("F9.one", m, dev)
        if key not in self.cache:
            picks = [int(torch.randint(0, c, (1,), generator=self._gen("F9.one"))) for c in range(1, m + 1)]
            self.cache[key] = torch.tensor(picks, dtype=torch.int64, device=dev)
        nonzero = s_a.reshape(-1) != 0
        count = nonzero.sum()
        rows = nonzero | (count == 0)  # no non-zero scale: every row is a candidate
        pick = self.cache[key][(torch.where(count == 0, m, count) - 1).reshape(1)]  # a tensor index: no sync
        row = rows & (torch.cumsum(rows, 0) - 1 == pick)
        return torch.where(row.reshape(-1, 1), s_a * F9A_FACTOR, s_a)

    def f9b_operand(self, a: torch.Tensor) -> torch.Tensor:
        """a with ceil(1% of M*K) seeded elements shifted by one (the catalogue's indices)."""
        n, dev = a.numel(), a.device
        key = ("F9.1pct", n, dev)
        if key not in self.cache:
            idx = torch.randint(0, n, (math.ceil(0.01 * n),), generator=self._gen("F9.1pct"))
            self.cache[key] = torch.unique(idx).to(dev)
        idx = self.cache[key]
        flat = a.reshape(-1).clone()
        flat[idx] = shift_int8_by_one(flat[idx])
        return flat.view_as(a)
