"""Kernels drawn by tests/audit/test_batched_oracle.py, importable as MODULE:FUNCTION so that the audit
resolves them as it resolves a user's kernel (`--backends`, `--order` or conform's fingerprint).

A name spells the kernel: `ORDER_CONDITION_DENSITY_KIND_SALT`, e.g. `cutlass_small_d1e3_256x768_7`:
the CUTLASS order with the low bit of about one output in 10**3 flipped (one bf16 spacing) when M <= 8.
ORDER: cutlass, triton, fused. CONDITION: legal (never wrong), always, small (M <= 8), large (M > 64),
native (some weight scale is not a power of two), kind (the weight's [N, K] is KIND), odd (the
weights' checksum is odd: about half of a model's Linears, so some experts of one shape and not
others; drawn in the MoE cases only, MOE_CONDITIONS). DENSITY: d1
(every element), d1e3, d1e5 (a seeded hash of the flat index picks the elements).

The orders are written here from their definitions (float64 accumulator, exact for these K; fp32
scale products in the order's sequence; torch's fp32 -> bf16 cast, round half to even),
independently of requant.kernels.reference.
"""

from dataclasses import dataclass

import torch


def _acc(a, w):
    return (a.to(torch.float64) @ w.to(torch.float64).T).to(torch.float32)


def _triton(a, w, s_a, s_w):
    return ((_acc(a, w) * s_a.reshape(-1, 1)) * s_w.reshape(1, -1)).to(torch.bfloat16)


def _cutlass(a, w, s_a, s_w):
    return (s_a.reshape(-1, 1) * (s_w.reshape(1, -1) * _acc(a, w))).to(torch.bfloat16)


def _fused(a, w, s_a, s_w):
    return (_acc(a, w) * (s_a.reshape(-1, 1) * s_w.reshape(1, -1))).to(torch.bfloat16)


ORDERS = {"triton-order": _triton, "cutlass-order": _cutlass, "fused-order": _fused}
CONDITIONS = ("legal", "always", "small", "large", "native", "kind")
MOE_CONDITIONS = ("odd", "kind", "small", "legal")  # the first MoE kernel's condition cycles through these
DENSITIES = {"d1": 1.0, "d1e3": 1e-3, "d1e5": 1e-5}


def _all_pow2(s) -> bool:
    mant, _ = torch.frexp(s.to(torch.float64))
    return bool(((mant == 0.5) & (s > 0)).all())


@dataclass(frozen=True)
class Spec:
    """The kernel a name spells (module docstring)."""

    order: str
    condition: str
    density: str = "d1"
    kind: tuple = ()
    salt: int = 0

    @property
    def name(self) -> str:
        kind = "x".join(map(str, self.kind)) or "0x0"
        return f"{self.order.removesuffix('-order')}_{self.condition}_{self.density}_{kind}_{self.salt}"

    @classmethod
    def parse(cls, name: str) -> "Spec":
        order, cond, density, kind, salt = name.split("_")
        if f"{order}-order" not in ORDERS or cond not in (*CONDITIONS, "odd") or density not in DENSITIES:
            raise AttributeError(name)
        return cls(f"{order}-order", cond, density, tuple(int(v) for v in kind.split("x")), int(salt))

    def applies(self, a, w, s_w) -> bool:
        m = a.shape[0]
        return {
            "legal": False,
            "always": True,
            "small": m <= 8,
            "large": m > 64,
            "native": not _all_pow2(s_w),
            "kind": tuple(w.shape) == self.kind,
            "odd": int(w.to(torch.int64).sum()) % 2 == 1,
        }[self.condition]

    def __call__(self, a, w, s_a, s_w):
        y = ORDERS[self.order](a, w, s_a, s_w)
        if not self.applies(a, w, s_w):
            return y
        bits = y.view(torch.int16).clone().reshape(-1)
        share = DENSITIES[self.density]
        if share < 1:  # a seeded hash of the flat index picks about share * numel elements
            i = torch.arange(bits.numel(), dtype=torch.int64)
            pick = ((i * 2654435761 + self.salt) % (1 << 32)) < int(share * (1 << 32))
            bits[pick] ^= 1
        else:
            bits ^= 1
        return bits.view(torch.bfloat16).view_as(y)


def __getattr__(name: str):
    """MODULE:FUNCTION resolution: the kernel the name spells."""
    if name.startswith("__"):
        raise AttributeError(name)
    return Spec.parse(name)


def zeros_small(a, w, s_a, s_w):
    """The kernel that hid behind a shared baseline cell: the CUTLASS order, but zeros at M <= 8."""
    y = _cutlass(a, w, s_a, s_w)
    return torch.zeros_like(y) if a.shape[0] <= 8 else y
