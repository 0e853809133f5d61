"""W8A8 GEMM backends behind one call signature, picked by name.

    requant.kernels.scaled_mm(a, w, s_a, s_w, backend=NAME) -> bf16 [M, N]
    requant.kernels.quantize_activations(x, backend=NAME)   -> (q int8 [M, K], s fp32 [M, 1])

See kernels/reference.py for the operand contract and the numerics every backend
documents. Backends are imported on first use, so `import requant.kernels` never pulls in
Triton or compiles CUTLASS; a resolved backend is kept, so later calls cost one dict lookup.

Design notes: docs/internals.md (kernels/__init__.py).
"""

if __name__ == "kernels":  # imported from the clone's root under its bare name: requant/_toplevel.py
    from requant._toplevel import hand_over

    hand_over(__name__, __file__)


import importlib

import torch

_SCALED_MM = {
    "reference": "requant.kernels.reference:scaled_mm_exact",
    "reference-cutlass-order": "requant.kernels.reference:scaled_mm_cutlass_order",
    "reference-triton-order": "requant.kernels.reference:scaled_mm_triton_order",
    "triton": "requant.kernels.triton:scaled_mm",
    "cutlass": "requant.kernels.cutlass:scaled_mm",
    "reference-fused-order": "requant.kernels.reference:scaled_mm_fused_order",
    "cublas": "requant.kernels.cublas:scaled_mm",
}
_QUANTIZE = {
    "reference": "requant.kernels.reference:quantize_activations",
    "triton": "requant.kernels.triton:quantize_activations",
}
# Which epilogue order each backend implements: the reference a real kernel must equal.
EMULATION_OF = {
    "triton": "reference-triton-order",
    "cutlass": "reference-cutlass-order",
    "reference-triton-order": "reference-triton-order",
    "reference-cutlass-order": "reference-cutlass-order",
    "cublas": "reference-fused-order",
    "reference-fused-order": "reference-fused-order",
}


_BUILTIN = frozenset(_SCALED_MM)
_RESOLVED: dict = {}


def _resolve(table: dict, kind: str, name: str):
    fn = _RESOLVED.get((kind, name))
    if fn is not None:
        return fn
    if name not in table:
        raise KeyError(f"unknown {kind} backend {name!r}; known: {', '.join(table)}")
    module, attr = table[name].split(":")
    fn = _RESOLVED[(kind, name)] = getattr(importlib.import_module(module), attr)
    return fn


def register_scaled_mm(name: str, fn, order: str | None = None) -> None:
    """Register a scaled_mm callable fn(a, w, s_a, s_w) -> bf16 [M, N] under `name` (a
    MODULE:FUNCTION kernel, or a wrapper such as the audit's fault injector). order: the
    epilogue order it declares ("cutlass-order", "triton-order", "fused-order"), recorded in
    EMULATION_OF; None declares none. Registering a built-in name is refused."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in scaled_mm backend")
    if not callable(fn):
        raise ValueError(f"scaled_mm backend {name!r}: {fn!r} is not callable")
    _SCALED_MM[name] = None  # resolved already: no module path to import
    _RESOLVED[("scaled_mm", name)] = fn
    EMULATION_OF.pop(name, None)
    if order is not None:
        EMULATION_OF[name] = "reference" if order == "exact" else f"reference-{order}"


def unregister_scaled_mm(name: str) -> None:
    """Remove a backend added by register_scaled_mm (a no-op for an unknown name)."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in scaled_mm backend")
    _SCALED_MM.pop(name, None)
    _RESOLVED.pop(("scaled_mm", name), None)
    EMULATION_OF.pop(name, None)


def scaled_mm_backends() -> list[str]:
    """The registered scaled_mm backend names."""
    return list(_SCALED_MM)


def quantize_backends() -> list[str]:
    """The registered quantize_activations backend names."""
    return list(_QUANTIZE)


def scaled_mm(
    a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, backend: str = "reference-cutlass-order"
) -> torch.Tensor:
    """y = epilogue(sum_k a[m, k] * w[n, k], s_a[m], s_w[n]) in the backend's documented order.

    Args:
        a: int8 [M, K] activations (per-token quantized).
        w: int8 [N, K] weights (per output channel).
        s_a: fp32 [M, 1] activation scales.
        s_w: fp32 [N, 1] weight scales.
        backend: a name of scaled_mm_backends(); see the module docstring for the orders.

    Returns:
        bf16 [M, N], on the operands' device.
    """
    fn = _RESOLVED.get(("scaled_mm", backend))
    if fn is None:
        fn = _resolve(_SCALED_MM, "scaled_mm", backend)
    return fn(a, w, s_a, s_w)


def quantize_activations(
    x: torch.Tensor, backend: str = "reference", check: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _resolve(_QUANTIZE, "quantize_activations", backend)(x, check=check)
