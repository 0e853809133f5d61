"""The nearest arm on any torch device: the same bytes as requant.scales.requantizer, computed
with torch ops where the weight lives (a GPU when the audit runs on CUDA).

    e   = nearest_exponent(s)            (requant.scales.exponents: from the float's bits)
    s'  = 2^e in s's dtype               (pow2_scale: exact or refused)
    r   = s / s'                         (an exponent shift: exact in float64, then in the
                                          compute dtype: float32 for bf16/fp16 scales, float64
                                          for fp32 scales, as the numpy path)
    q'  = clamp(round_half_even(q * r), -128, 127)   (q * r exact in that dtype; clamping before
                                          or after rounding is the same: integer bounds)

The exponents and scales are computed on the host (a few thousand values per Linear) by the very
functions the converter uses; only the [out, in] elementwise work runs on the device.
Proof: tests/requant/scales/test_device.py (equal to requantize(q, s, "nearest") bit for bit).
"""

from __future__ import annotations

import torch

from requant.scales.exponents import nearest_exponent, pow2_scale
from requant.scales.requantizer import check_inputs


def requantize_nearest(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q' int8 on q's device, s' [out, 1] in scale's dtype on the host): requantize(q, s, "nearest")."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"weight must be int8 [out, in], got {q.dtype} {list(q.shape)}")
    s_host = scale.detach().cpu()
    check_inputs(torch.empty((q.shape[0], 0), dtype=torch.int8), s_host)  # the scale's checks, no copy of q
    e = nearest_exponent(s_host)
    s_new = pow2_scale(e, s_host.dtype)
    cdt = torch.float32 if s_host.dtype in (torch.bfloat16, torch.float16) else torch.float64
    ratio = (s_host.to(torch.float64) / s_new.to(torch.float64)).to(cdt)  # exact: exponent shift only
    if q.device.type == "cuda":  # pinned, non-blocking: no stream synchronisation per Linear
        ratio = ratio.pin_memory().to(q.device, non_blocking=True)
    x = q.to(cdt) * ratio.to(q.device)
    q_new = torch.round(x).clamp_(-128, 127).to(torch.int8)
    return q_new, s_new


def requantize_nearest_many(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[requantize_nearest(q, s) for (q, s) in pairs], the same bits, in one pass when the weights
    share their input width, device and scale dtype: stacked along the output axis (every row is
    requantized with its own scale alone, so stacking cannot change a bit), the results views of the
    stacked tensors. A Linear at a time costs a few host ops and launches each (0.2 ms: 3.8 s for
    the 18,624 Linears of a Qwen3-30B-A3B audit on a GPU). A refused scale is reported as
    requantize_nearest reports it, by the first Linear that holds it."""
    if len(pairs) < 2 or len({(q.shape[1:], q.device, s.dtype) for q, s in pairs}) != 1:
        return [requantize_nearest(q, s) for q, s in pairs]
    try:
        q_new, s_new = requantize_nearest(torch.cat([q for q, _ in pairs]), torch.cat([s for _, s in pairs]))
    except ValueError:
        return [requantize_nearest(q, s) for q, s in pairs]  # the same error, from its Linear
    rows = [q.shape[0] for q, _ in pairs]
    return list(zip(q_new.split(rows), s_new.split(rows)))
