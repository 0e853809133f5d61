"""From the original float weights: llm-compressor's RTN, and the arms applied to it.

`rtn_quantize` is llm-compressor's minmax observer + compressed-tensors' quantize for
symmetric int8 per-channel weights, in the weight's own dtype (bf16), each op rounding
to that dtype as in compressed-tensors:
    absmax = max(|min(w, 0)|, |max(w, 0)|) per output channel  (= max |w|, exact in bf16)
    scale  = absmax / 127.5                                     (rtn_scale)
    q      = int8(round_half_even(clamp(w / scale, -128, 127)))  (rtn_at_scale)
Round and clamp commute because the bounds are integers. The absmax element maps to about
+-127.5, so positive maxima land on 127 and negative ones on -128. Every step is per row,
so blocks of rows give the same bytes as the whole tensor (the --source origin proof,
requant.evidence.origin, streams them). requant.checkpoint.synthetic makes its checkpoints with it.

`quantize_from_source` (the converter's --source path) makes (q, s') under an arm from the
float weight instead of the int8 one: w / s' is exact in float64 for a power of two s'.
"""

from __future__ import annotations

import numpy as np
import torch

from requant.scales import ARMS
from requant.scales.exponents import ceil_exponent, nearest_exponent, pow2_candidates, pow2_scale, shift_histogram
from requant.scales.requantizer import BLOCK_ELEMENTS, MSE_OFFSETS, LinearStats


def rtn_scale(w: torch.Tensor, *, allow_zero: bool = False) -> torch.Tensor:
    """llm-compressor's RTN scale per output channel: absmax / 127.5 in w's dtype, [out, 1].
    A row of zeros has no scale: ValueError, or 0 for that row with allow_zero."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a 2-D float weight, got {w.dtype} {tuple(w.shape)}")
    zero = torch.zeros((), dtype=w.dtype)
    min_val = torch.minimum(w.amin(dim=1, keepdim=True), zero)
    max_val = torch.maximum(w.amax(dim=1, keepdim=True), zero)
    absmax = torch.maximum(min_val.abs(), max_val.abs())
    scale = absmax / 127.5
    if not allow_zero and bool((scale == 0).any()):
        raise ValueError("a row of zeros has no RTN scale")
    return scale


def rtn_at_scale(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' quantize of w [out, in] at a given per-channel scale [out, 1]:
    int8(round_half_even(clamp(w / scale, -128, 127))). The division runs in torch's
    promoted dtype of the two (w's own dtype when the scale has it, as in RTN)."""
    return torch.round(torch.clamp(w / scale, -128, 127)).to(torch.int8)


def rtn_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llm-compressor's RTN for symmetric int8 per-channel weights.

    Assumptions: w is a 2-D float tensor [out, in] in the checkpoint dtype (bf16); every
    row has a non-zero element. All arithmetic happens in w's dtype, as in
    compressed-tensors (each op rounds to that dtype).
    Returns (q int8 [out, in], scale [out, 1] in w's dtype).
    """
    scale = rtn_scale(w)
    return rtn_at_scale(w, scale), scale


def _round_clip_rows(w: np.ndarray, inv_scale: np.ndarray):
    """clamp(rint(w * inv_scale)) per row, with inv_scale a power of two per row (so the
    product is exact in float64). Returns (q int8, clipped per row, sum((q/inv - w)^2) per row)."""
    rows, cols = w.shape
    q = np.empty((rows, cols), dtype=np.int8)
    clipped = np.zeros(rows, dtype=np.int64)
    sq = np.zeros(rows, dtype=np.float64)
    step = max(1, BLOCK_ELEMENTS // max(cols, 1))
    for i in range(0, rows, step):
        x = w[i : i + step].astype(np.float64) * inv_scale[i : i + step]
        r = np.rint(x)
        clipped[i : i + step] = np.count_nonzero(r > 127, axis=1) + np.count_nonzero(r < -128, axis=1)
        np.clip(r, -128, 127, out=r)
        q[i : i + step] = r
        d = (r - x) / inv_scale[i : i + step]  # exact: a power of two
        sq[i : i + step] = np.einsum("ij,ij->i", d, d)
    return q, clipped, sq


def quantize_from_source(
    w: torch.Tensor, arm: str, scale_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, LinearStats]:
    """(q, s, stats) made from an original float weight instead of the int8 one.

    Assumptions: w is the float [out, in] weight the int8 checkpoint was made from (bf16
    as llm-compressor saw it); no row is all zeros. The reference scale is
    llm-compressor's, s = absmax/127.5 in w's dtype (rtn_quantize).
      unconstrained: llm-compressor's RTN exactly (q, s), so an RTN-made checkpoint is
                     reproduced byte for byte;
      nearest / ceiling: s' = 2^e from s as for the int8 arms, q = clamp(rint(w / s'))
                     with w / s' exact in float64 (a power of two);
      mse:           per channel the candidate 2^e (e = ceil(log2 s) + MSE_OFFSETS) that
                     minimises sum((q s' - w)^2), ties to the earlier candidate;
      probe:         RTN q with s' = the nearest power of two (the ablation).
    The returned scale is cast to scale_dtype (default w's dtype); stats measure the
    error against w itself. Unlike the int8 path, ceiling can clip here: the bf16 RTN scale
    may round below absmax/127.5, so |w / s'| <= 128 and a channel's maximum may land on
    127.5..128 and saturate to 127 (by less than one step, as in llm-compressor's RTN).
    """
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"source weight must be a 2-D float tensor, got {w.dtype} {list(w.shape)}")
    scale_dtype = scale_dtype or w.dtype
    q_rtn, s_rtn = rtn_quantize(w)
    s_ref = s_rtn.to(scale_dtype)
    rows, cols = w.shape
    stats = LinearStats(rows=rows, cols=cols)
    # float32 holds bf16/fp16 exactly; blocks are widened to float64 as they are used
    wn = w.contiguous().numpy() if w.dtype in (torch.float32, torch.float64) else w.to(torch.float32).numpy()
    step = max(1, BLOCK_ELEMENTS // max(cols, 1))
    stats.sq_norm = sum(
        float(np.einsum("ij,ij->", b, b)) for b in (wn[i : i + step].astype(np.float64) for i in range(0, rows, step))
    )

    def error_of(q: torch.Tensor, s: torch.Tensor) -> float:
        s64 = s.to(torch.float64).numpy()
        total = 0.0
        for i in range(0, rows, step):
            d = q[i : i + step].numpy().astype(np.float64) * s64[i : i + step] - wn[i : i + step]
            total += float(np.einsum("ij,ij->", d, d))
        return total

    if arm in ("unconstrained", "probe"):
        q_new = q_rtn
        if arm == "unconstrained":
            s_new, e = s_ref, None
        else:
            e = nearest_exponent(s_ref)
            s_new = pow2_scale(e, scale_dtype)
        stats.sq_error = error_of(q_new, s_new)
    else:
        e_ceil = ceil_exponent(s_ref)
        offsets = MSE_OFFSETS if arm == "mse" else (0,)
        base = nearest_exponent(s_ref) if arm == "nearest" else e_ceil
        best_q, best_err, best_e, best_clip = None, np.full(rows, np.inf), base.clone(), np.zeros(rows, dtype=np.int64)
        for off in offsets:
            e_c = base + off
            # per channel, as in Requantizer: an unrepresentable 2^e is no candidate for
            # that channel only (inv 1 is a placeholder; its error is set to inf)
            _, ok = pow2_candidates(e_c, scale_dtype)
            inv = np.where(
                ok, torch.ldexp(torch.ones(e_c.shape, dtype=torch.float64), -e_c).reshape(-1).numpy(), 1.0
            ).reshape(-1, 1)
            q_c, clipped, sq = _round_clip_rows(wn, inv)
            sq = np.where(ok, sq, np.inf)
            better = sq < best_err
            if best_q is None:
                best_q = q_c
            else:
                best_q[better] = q_c[better]
            best_err[better] = sq[better]
            best_clip[better] = clipped[better]
            best_e[torch.from_numpy(better)] = e_c[torch.from_numpy(better)]
        e = best_e
        s_new = pow2_scale(e, scale_dtype)
        q_new = torch.from_numpy(best_q)
        stats.weights_clipped = int(best_clip.sum())
        stats.sq_error = float(best_err.sum())
    stats.scales_changed = int((s_new.to(torch.float64) != s_ref.to(torch.float64)).sum())
    stats.exponent_shifts = {} if e is None else shift_histogram(e, s_ref)
    return q_new, s_new, stats
