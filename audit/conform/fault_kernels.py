"""Every fault of the catalogue (audit/catalogue/faults.py) wrapped as a scaled_mm kernel, so that
`requant conform --kernel requant.audit.conform.fault_kernels:F4` can fingerprint it.

Each kernel checks the operand contract, forms the exact reference case on its operands
(audit.catalogue.faults.reference_case) and returns the output of one variant at severity "all"
(F9: all three operand variants, F9a one scale, F9b 1% of activations, F9c all of them).
Expected fingerprints (FAULT_FORMULAS): the formula of audit/conform/formulas.py each implements, with
its accumulator model; None for the operand faults, which match no formula.
"""

from __future__ import annotations

from requant.audit.catalogue.faults import VARIANT_BY_ID, inject, reference_case
from requant.audit.records import Activations, Weights
from requant.kernels.reference import check_operands

__all__ = ["FAULTS", "FAULT_FORMULAS", "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9a", "F9b", "F9c"]


def _wrap(variant_id: str):
    variant = VARIANT_BY_ID[variant_id]

    def kernel(a, w, s_a, s_w):
        check_operands(a, w, s_a, s_w)
        case = reference_case("conform", "native", Activations(a, s_a), Weights(w, s_w))
        return inject(variant, case).y

    kernel.__name__ = kernel.__qualname__ = variant_id.replace(".", "_")
    kernel.__doc__ = f"Fault {variant_id} of audit/catalogue/faults.py as a scaled_mm kernel."
    return kernel


F1, F2, F3, F4, F5 = (_wrap(f"F{i}.all") for i in range(1, 6))
F6, F7, F8 = _wrap("F6.all"), _wrap("F7.all"), _wrap("F8.all")
F9a, F9b, F9c = _wrap("F9.one"), _wrap("F9.1pct"), _wrap("F9.all")

FAULTS = {
    "F1": F1,
    "F2": F2,
    "F3": F3,
    "F4": F4,
    "F5": F5,
    "F6": F6,
    "F7": F7,
    "F8": F8,
    "F9a": F9a,
    "F9b": F9b,
    "F9c": F9c,
}
# (accumulator model, formula) each fault implements; None: matches no formula.
FAULT_FORMULAS = {
    "F1": ("exact", "triton-order+F1"),
    "F2": ("exact", "triton-order+F2"),
    "F3": ("exact", "cutlass-order"),
    "F4": ("exact", "triton-order+F4"),
    "F5": ("exact", "fused-order"),
    "F6": ("bf16-tiles", "triton-order"),
    "F7": ("int16-wrap", "triton-order"),
    "F8": ("exact", "triton-order"),
    "F9a": None,
    "F9b": None,
    "F9c": None,
}
