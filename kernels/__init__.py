"""W8A8 GEMM backends behind one call signature, picked by name or given as a resolved kernel.

    requant.kernels.scaled_mm(a, w, s_a, s_w, backend=NAME or ScaledMM) -> bf16 [M, N]
    requant.kernels.quantize_activations(x, backend=NAME)   -> (q int8 [M, K], s fp32 [M, 1])
    requant.kernels.lookup(NAME) -> ScaledMM (name, callable, declared order); emulation_of(backend)

See kernels/reference.py for the operand contract and the numerics every backend
documents. Backends are imported on first use, so `import requant.kernels` never pulls in
Triton or compiles CUTLASS; a resolved backend is kept, so later calls cost one dict lookup.
  reference   the exact oracle: every epilogue order in torch, the operand contract, quantization
  ops         the reference engine's torch ops (RMSNorm, RoPE, tree sums, dense rows, attention)
  emulation   torch emulations of the fast engine's fused kernels and attention (the tests' references)
  portable    the portable arithmetic in torch, its specification; math64 exp/log from + * /
  epilogue    the GEMM split into the exact int32 accumulator and an epilogue (tensor parallelism)
  bf16        rounding and distances on fp32 bits
  cublas      torch._int_mm with the fused-scale epilogue
  triton/     the Triton GEMM, quantization, fused row, attention, dense and portable kernels
  cutlass/    the CUTLASS 3.x sm90a GEMM, built just in time

Imports only torch, triton, numpy, the CUTLASS headers' locator and itself (tests/test_layers.py).
The backends, their numerics and the host path: docs/kernels.md.
"""

if __name__ == "kernels":  # imported from the clone's root under its bare name: requant/_toplevel.py
    from requant._toplevel import hand_over

    hand_over(__name__, __file__)


import importlib
from collections.abc import Callable
from types import MappingProxyType

import torch

_SCALED_MM = {
    "reference": "requant.kernels.reference:scaled_mm_exact",
    "reference-cutlass-order": "requant.kernels.reference:scaled_mm_cutlass_order",
    "reference-triton-order": "requant.kernels.reference:scaled_mm_triton_order",
    "triton": "requant.kernels.triton:scaled_mm",
    "cutlass": "requant.kernels.cutlass:scaled_mm",
    "reference-fused-order": "requant.kernels.reference:scaled_mm_fused_order",
    "cublas": "requant.kernels.cublas:scaled_mm",
    # vLLM's int8 fused-MoE kernel: the Triton order on a plain GEMM; its routed down projection
    # and combine need the route (kernels/fused_moe.py, runtime/moe.py)
    "reference-vllm-moe-order": "requant.kernels.fused_moe:scaled_mm_vllm_moe",
}
_QUANTIZE = {
    "reference": "requant.kernels.reference:quantize_activations",
    "triton": "requant.kernels.triton:quantize_activations",
}
# Which epilogue order each built-in backend implements: the reference a real kernel must equal.
# Read-only: a kernel added for one run carries its order itself (ScaledMM), never in this table.
EMULATION_OF = MappingProxyType(
    {
        "triton": "reference-triton-order",
        "cutlass": "reference-cutlass-order",
        "reference-triton-order": "reference-triton-order",
        "reference-cutlass-order": "reference-cutlass-order",
        "cublas": "reference-fused-order",
        "reference-fused-order": "reference-fused-order",
        "reference-vllm-moe-order": "reference-triton-order",
    }
)

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


class ScaledMM(str):
    """A scaled_mm kernel resolved for a run (vLLM's typed kernels, in one class): the object is
    its name, so records, dict keys and messages carry the name unchanged, and it holds the
    callable fn(a, w, s_a, s_w) -> bf16 [M, N] and the epilogue order it declares
    ("cutlass-order", "triton-order", "fused-order", "exact"; None: none). A MODULE:FUNCTION
    kernel or the audit's fault injector is one of these, passed as `backend=`; nothing global
    is registered, so a run's kernel ends with the run."""

    fn: Callable
    order: str | None

    def __new__(cls, name: str, fn: Callable, order: str | None = None):
        if not callable(fn):
            raise ValueError(f"scaled_mm backend {name!r}: {fn!r} is not callable")
        self = super().__new__(cls, name)
        self.fn, self.order = fn, order
        return self

    def __reduce__(self):
        return ScaledMM, (str(self), self.fn, self.order)

    @property
    def name(self) -> str:
        return str(self)

    @property
    def emulation(self) -> str | None:
        """The reference backend that computes this kernel's declared order."""
        if self.order is None:
            return None
        return "reference" if self.order == "exact" else f"reference-{self.order}"


def lookup(backend: str) -> ScaledMM:
    """The kernel a backend names (a ScaledMM is itself): a built-in name imports its module on
    first use. KeyError naming the known backends for any other name."""
    if isinstance(backend, ScaledMM):
        return backend
    fn = _resolve(_SCALED_MM, "scaled_mm", backend)
    emu = EMULATION_OF.get(backend)
    return ScaledMM(backend, fn, None if emu is None else emu.removeprefix("reference-"))


def is_scaled_mm(backend) -> bool:
    """A built-in backend's name or a resolved kernel (ScaledMM)."""
    return isinstance(backend, ScaledMM) or backend in _SCALED_MM


def emulation_of(backend: str) -> str | None:
    """The reference emulation of the order a backend implements (EMULATION_OF for a built-in
    name, the declared order of a ScaledMM); None when it declares none."""
    if isinstance(backend, ScaledMM):
        return backend.emulation
    return EMULATION_OF.get(backend)


def scaled_mm_backends() -> list[str]:
    """The built-in scaled_mm backend names."""
    return list(_SCALED_MM)


def quantize_backends() -> list[str]:
    """The built-in quantize_activations backend names."""
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
        backend: a name of scaled_mm_backends() or a ScaledMM; see the module docstring for the orders.

    Returns:
        bf16 [M, N], on the operands' device.
    """
    if isinstance(backend, ScaledMM):
        return backend.fn(a, w, s_a, s_w)
    fn = _RESOLVED.get(("scaled_mm", backend))
    if fn is None:
        fn = _resolve(_SCALED_MM, "scaled_mm", backend)
    return fn(a, w, s_a, s_w)


def quantize_activations(
    x: torch.Tensor, backend: str = "reference", check: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _resolve(_QUANTIZE, "quantize_activations", backend)(x, check=check)
