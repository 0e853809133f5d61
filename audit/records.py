"""What one W8A8 GEMM run is, as the checks see it.

A run (the reference or a kernel under test) is described by what it consumed and what it
produced:
  * its activation operands (int8 a [M, K], fp32 s_a [M, 1]) and weight operands
    (int8 w [N, K], fp32 s_w [N, 1]), each with a sha256 digest computed once and cached,
    so that a fault which shares the reference's operands costs no second hash;
  * its accumulator [M, N] if the kernel exposes one (the exact reference and the emulated
    faults do; a real backend called through `kernels.scaled_mm` does not -> None);
  * its bf16 output [M, N];
  * optional logits (only for end-to-end model runs; the token-level check C7 uses them);
  * a static kernel description (accumulator type/width, epilogue order).

The checks in audit/catalogue/checks.py are pure functions of (reference run, run under test, kernel
description), so everything they may look at has to be here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from requant.kernels.bf16 import bitwise_equal, is_power_of_two, ulp_distance


def tensor_digest(*tensors: torch.Tensor) -> str:
    """sha256 over dtype, shape and raw bytes of each tensor (device-agnostic: bytes are
    read from a CPU copy, so a GPU run and a CPU run of the same operands agree)."""
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().contiguous().cpu()
        h.update(f"{c.dtype}|{tuple(c.shape)}|".encode())
        if c.numel():
            h.update(c.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


@dataclass(frozen=True)
class KernelDesc:
    """Static description of a GEMM implementation.

    acc_kind: "int" (two's complement, acc_bits including the sign bit) or "float"
    (acc_bits = significand bits including the implicit one: bf16 8, fp16 11, fp32 24).
    epilogue: the order in which the two scales are applied, as documented by the kernel.
    exposes_acc: whether the run hands its accumulator to the audit (C4 needs it).
    declares: the epilogue order the kernel claims to implement, one of KNOWN_ORDERS, when it
    differs from what `epilogue` says it does (a fault kernel claims the order of the pipeline
    it modifies); None means `epilogue` itself, if that names a known order (declared_order).
    """

    name: str
    acc_kind: str
    acc_bits: int
    epilogue: str
    exposes_acc: bool = True
    declares: str | None = None

    @property
    def declared_order(self) -> str | None:
        """The known order the kernel claims (C8 checks it), or None when it claims none."""
        order = self.declares if self.declares is not None else self.epilogue
        return order if order in KNOWN_ORDERS else None

    def exact_integer_bound(self) -> int:
        """Largest B such that every integer of magnitude <= B is held exactly."""
        if self.acc_kind == "int":
            return 2 ** (self.acc_bits - 1) - 1
        if self.acc_kind == "float":
            return 2**self.acc_bits
        raise ValueError(f"unknown accumulator kind {self.acc_kind!r}")

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "acc_kind": self.acc_kind,
            "acc_bits": self.acc_bits,
            "epilogue": self.epilogue,
            "exposes_acc": self.exposes_acc,
            "declares": self.declared_order,
        }


# Epilogue orders a kernel can declare, each emulated bit for bit in kernels/reference.py.
KNOWN_ORDERS = ("cutlass-order", "triton-order", "fused-order", "exact")


# The exact reference pipeline: exact int32 accumulator, the legal Triton epilogue order
# (acc * s_a) * s_w in fp32, one bf16 round-half-even (kernels.reference.epilogue_triton_order).
REFERENCE_KERNEL = KernelDesc("reference", "int", 32, "triton-order", True)

# What each registered backend documents about itself (kernels/__init__.py, kernels/reference.py):
# all accumulate int8 products in int32; they differ in the epilogue order only. None of them
# returns its accumulator through kernels.scaled_mm, so C4 is not applicable to them.
BACKEND_KERNELS = {
    "cutlass": KernelDesc("cutlass", "int", 32, "cutlass-order", False),
    "triton": KernelDesc("triton", "int", 32, "triton-order", False),
    "reference-cutlass-order": KernelDesc("reference-cutlass-order", "int", 32, "cutlass-order", False),
    "reference-triton-order": KernelDesc("reference-triton-order", "int", 32, "triton-order", False),
    "cublas": KernelDesc("cublas", "int", 32, "fused-order", False),
    "reference-fused-order": KernelDesc("reference-fused-order", "int", 32, "fused-order", False),
    "reference": KernelDesc("reference", "int", 32, "exact", False),
    # vLLM's int8 fused-MoE kernel: the Triton order on a plain GEMM (its routed down projection and
    # moe_sum are the MoE block's, audit/moe_combine.py)
    "reference-vllm-moe-order": KernelDesc("reference-vllm-moe-order", "int", 32, "triton-order", False),
}


@dataclass
class Activations:
    """Shared int8 activations and their per-token scales, digest cached."""

    a: torch.Tensor
    s_a: torch.Tensor
    _digest: str | None = field(default=None, repr=False)

    def digest(self) -> str:
        if self._digest is None:
            self._digest = tensor_digest(self.a, self.s_a)
        return self._digest


@dataclass
class Weights:
    """int8 weights and their per-channel fp32 scales, digest cached."""

    w: torch.Tensor
    s_w: torch.Tensor
    _digest: str | None = field(default=None, repr=False)
    _all_pow2: bool | None = field(default=None, repr=False)

    def digest(self) -> str:
        if self._digest is None:
            self._digest = tensor_digest(self.w, self.s_w)
        return self._digest

    def all_scales_power_of_two(self) -> bool:
        if self._all_pow2 is None:
            self._all_pow2 = bool(is_power_of_two(self.s_w).all())
        return self._all_pow2


@dataclass
class Run:
    """One GEMM run (or, with logits, one end-to-end model run)."""

    act: Activations | None
    wt: Weights | None
    acc: torch.Tensor | None
    y: torch.Tensor | None
    kernel: KernelDesc
    logits: torch.Tensor | None = None
    memo: dict = field(default_factory=dict, repr=False)


def output_equal(ref: Run, test: Run) -> bool:
    """Bitwise equality of the two outputs (kernels.bf16.bitwise_equal), memoized on `test`."""
    key = ("equal", id(ref.y))
    if key not in test.memo:
        test.memo[key] = bitwise_equal(ref.y, test.y)
    return test.memo[key]


def output_distance(ref: Run, test: Run) -> torch.Tensor:
    """Per-element bf16 distance (kernels.bf16.ulp_distance), memoized on `test`: C6, the
    cell's mismatch count and its histogram all read the same tensor."""
    key = ("dist", id(ref.y))
    if key not in test.memo:
        test.memo[key] = ulp_distance(ref.y, test.y)
    return test.memo[key]
