"""The formula catalogue of `requant conform`: every W8A8 epilogue formula it can tell apart,
and the accumulator models it can recognize.

NUMERICS
  Every formula maps the exact int32 accumulator acc [M, N] and the scales s_a [M, 1],
  s_w [N, 1] (fp32) to bf16 [M, N]. f = fp32(acc) (one rounding for |acc| > 2**24), every
  product or quotient below is one IEEE fp32 operation (round to nearest even), and
  rne / trunc are the fp32 -> bf16 roundings of kernels.bf16 (to nearest even / toward zero).

The catalogue: docs/conformance.md#formula-catalogue-auditconformformulaspy.
"""

from __future__ import annotations

import torch

from requant.audit.catalogue.faults import accumulate_bf16_tiles, wrap_int16
from requant.kernels.bf16 import round_fp32_to_bf16, truncate_fp32_to_bf16
from requant.kernels.reference import accumulate, epilogue_exact

__all__ = [
    "FORMULAS",
    "FORMULA_TITLES",
    "LEGAL_ORDERS",
    "ACC_MODELS",
    "ACC_TITLES",
    "apply_formula",
    "model_accumulator",
    "accumulate_fp32_tiles",
]

LEGAL_ORDERS = ("exact", "cutlass-order", "triton-order", "fused-order")
_ORDERS = ("cutlass-order", "triton-order", "fused-order")
_FAULTS = ("F1", "F2", "F4")
FORMULAS = LEGAL_ORDERS + tuple(f"{o}+{f}" for f in _FAULTS for o in _ORDERS)

FORMULA_TITLES = {
    "exact": "exact value (acc*s_a*s_w rounded once, RNE)",
    "cutlass-order": "CUTLASS order (s_a*(s_w*acc), RNE)",
    "triton-order": "Triton order ((s_a*acc)*s_w, RNE)",
    "fused-order": "fused-scale order (acc*(s_a*s_w), RNE; TensorRT-LLM SmoothQuant)",
    "cutlass-order+F1": "CUTLASS order with s_w via an fp32 reciprocal (s_a*(acc/(1/s_w)), RNE)",
    "triton-order+F1": "Triton order with s_w via an fp32 reciprocal ((s_a*acc)/(1/s_w), RNE): fault F1",
    "fused-order+F1": "fused-scale order with s_w via an fp32 reciprocal (acc*(s_a/(1/s_w)), RNE)",
    "cutlass-order+F2": "CUTLASS order rounded to bf16 after s_w (s_a*bf16(s_w*acc), RNE)",
    "triton-order+F2": "Triton order rounded to bf16 after s_a (bf16(s_a*acc)*s_w, RNE): fault F2",
    "fused-order+F2": "fused-scale order with a bf16 scale product (acc*bf16(s_a*s_w), RNE)",
    "cutlass-order+F4": "CUTLASS order truncated to bf16 (s_a*(s_w*acc), toward zero)",
    "triton-order+F4": "Triton order truncated to bf16 ((s_a*acc)*s_w, toward zero): fault F4",
    "fused-order+F4": "fused-scale order truncated to bf16 (acc*(s_a*s_w), toward zero)",
}

ACC_MODELS = ("exact", "int16-wrap", "bf16-tiles", "fp32-tiles")
ACC_TITLES = {
    "exact": "exact int32 accumulation",
    "int16-wrap": "an int16 accumulator that wraps (fault F7)",
    "bf16-tiles": "a bf16 accumulator (K-tiles of 64; fault F6)",
    "fp32-tiles": "an fp32 accumulator (K-tiles of 64)",
}
FP32_TILE = 64


def _bf16_f32(x: torch.Tensor) -> torch.Tensor:
    return round_fp32_to_bf16(x).to(torch.float32)


def apply_formula(name: str, acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """The named formula on an accumulator (int32 or an fp32 accumulator model) -> bf16."""
    if name == "exact":
        return epilogue_exact(acc, s_a, s_w)
    order, _, fault = name.partition("+")
    if order not in _ORDERS or fault not in ("", *_FAULTS):
        raise KeyError(f"unknown formula {name!r}; known: {', '.join(FORMULAS)}")
    f = acc.to(torch.float32)
    sa = s_a.reshape(-1, 1)
    sw = s_w.reshape(1, -1)
    recip = 1.0 / sw  # the precomputed per-channel reciprocal of F1 (as audit/catalogue/faults.py forms it)
    if order == "cutlass-order":
        inner = f / recip if fault == "F1" else sw * f
        inner = _bf16_f32(inner) if fault == "F2" else inner
        y = sa * inner
    elif order == "triton-order":
        inner = sa * f
        inner = _bf16_f32(inner) if fault == "F2" else inner
        y = inner / recip if fault == "F1" else inner * sw
    else:
        scale = sa / recip if fault == "F1" else sa * sw
        scale = _bf16_f32(scale) if fault == "F2" else scale
        y = f * scale
    return truncate_fp32_to_bf16(y) if fault == "F4" else round_fp32_to_bf16(y)


def accumulate_fp32_tiles(a: torch.Tensor, w: torch.Tensor, tile: int = FP32_TILE) -> torch.Tensor:
    """Exact sums of K-tiles added in order into an fp32 register (returned as fp32)."""
    m, k = a.shape
    n = w.shape[0]
    pad = (-k) % tile
    a64 = torch.nn.functional.pad(a.to(torch.float64), (0, pad)).view(m, -1, tile).transpose(0, 1)
    w64 = torch.nn.functional.pad(w.to(torch.float64), (0, pad)).view(n, -1, tile).transpose(0, 1)
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for a_t, w_t in zip(a64, w64):
        acc = acc + (a_t @ w_t.T).to(torch.float32)  # tile sum exact (|.| <= 2**20); one fp32 add
    return acc


def model_accumulator(model: str, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The accumulator a kernel of the named model forms from int8 a [M, K], w [N, K]."""
    if model == "exact":
        return accumulate(a, w)
    if model == "int16-wrap":
        return wrap_int16(accumulate(a, w))
    if model == "bf16-tiles":
        return accumulate_bf16_tiles(a, w)
    if model == "fp32-tiles":
        return accumulate_fp32_tiles(a, w)
    raise KeyError(f"unknown accumulator model {model!r}; known: {', '.join(ACC_MODELS)}")
