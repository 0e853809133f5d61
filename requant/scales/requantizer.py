"""The requantizer: int8 weights and their per-channel scales under one arm.

Requantization (nearest, ceiling, mse): q' = clamp(round_half_even(q * s / s'), -128, 127).
  s' = 2^e (requant.scales.exponents). r = s / s' is s with its exponent shifted: exact. q * r has
  at most 8 + 8 significant bits for a bf16 scale (8 + 11 for fp16): exact in float32, so
  those run in float32; an fp32 scale (24 bits) needs up to 32 bits and runs in float64,
  also exact. numpy's rint rounds half to even. Ceiling has s' >= s, so |q * r| <= 128 and
  nothing clips (-128 maps to >= -128); nearest may pick s' < s (by up to 2^1/2) and clip:
  counted.

The arms, the mse tie rule and why the arithmetic is exact: docs/checkpoints.md#arms---arm.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from requant.scales import ARMS
from requant.scales.exponents import ceil_exponent, nearest_exponent, pow2_candidates, pow2_scale, shift_histogram

SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MSE_OFFSETS = (0, -1, 1, -2, -3)  # relative to the ceiling exponent, in tie-break order
BLOCK_ELEMENTS = 1 << 18  # elements per block of rows in the hot loop


@dataclass
class LinearStats:
    """What one Linear's conversion did. Errors are squared Frobenius norms (float64)."""

    rows: int
    cols: int
    scales_changed: int = 0
    exponent_shifts: dict[int, int] = field(default_factory=dict)  # e' - ceil(log2 s) -> channels
    weights_clipped: int = 0
    sq_error: float = 0.0  # sum over the layer of (q' s' - q s)^2
    sq_norm: float = 0.0  # sum over the layer of (q s)^2

    @property
    def rel_error(self) -> float:
        return (self.sq_error / self.sq_norm) ** 0.5 if self.sq_norm > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "rows": self.rows,
            "cols": self.cols,
            "scales_changed": self.scales_changed,
            "exponent_shifts": {str(k): v for k, v in sorted(self.exponent_shifts.items())},
            "weights_clipped": self.weights_clipped,
            "rel_weight_error": self.rel_error,
        }


def check_inputs(q: torch.Tensor, scale: torch.Tensor) -> None:
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"weight must be int8 [out, in], got {q.dtype} {list(q.shape)}")
    if scale.dtype not in SCALE_DTYPES:
        raise ValueError(f"scale dtype {scale.dtype} is not bf16, fp16 or fp32")
    if tuple(scale.shape) != (q.shape[0], 1):
        raise ValueError(f"scale shape {list(scale.shape)} does not match weight {list(q.shape)}")
    s = scale.to(torch.float64)
    if not bool((torch.isfinite(s) & (s > 0)).all()):
        raise ValueError("scales must be finite and positive")


def _compute_dtype(scale_dtype: torch.dtype):
    return np.float32 if scale_dtype in (torch.bfloat16, torch.float16) else np.float64


_VECDOT = getattr(np.linalg, "vecdot", None)  # numpy >= 2.0: ~2x faster than einsum here


def _row_dots(x: np.ndarray, exact: bool) -> np.ndarray:
    """Per-row sum of x^2: float64 accumulation when exact, else in x's dtype (a statistic)."""
    if exact:
        return np.einsum("ij,ij->i", x, x, dtype=np.float64)
    if _VECDOT is not None:
        return _VECDOT(x, x)
    return np.einsum("ij,ij->i", x, x)


_SCRATCH = threading.local()


def _scratch(n: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two float work buffers and a bool mask of n elements, kept per thread: allocating
    them per call would cost fresh (page-faulted, zeroed) memory for every block."""
    key = np.dtype(dtype).name
    bufs = getattr(_SCRATCH, key, None)
    if bufs is None or bufs[0].size < n:
        m = max(n, BLOCK_ELEMENTS)
        bufs = (np.empty(m, dtype=dtype), np.empty(m, dtype=dtype), np.empty(m, dtype=bool))
        setattr(_SCRATCH, key, bufs)
    return bufs[0][:n], bufs[1][:n], bufs[2][:n]


def _row_sq(q: np.ndarray) -> np.ndarray:
    """Per-row sum of q^2, exact (int64 accumulation; the float64 result is exact while a
    row sum stays below 2^53, i.e. for rows of fewer than 2^39 elements)."""
    out = np.empty(q.shape[0], dtype=np.float64)
    step = max(1, BLOCK_ELEMENTS // max(q.shape[1], 1))
    for i in range(0, q.shape[0], step):
        b = q[i : i + step]
        out[i : i + step] = np.einsum("ij,ij->i", b, b, dtype=np.int64)
    return out


def _requantize_rows(q: np.ndarray, ratio: np.ndarray, cdt, out: np.ndarray | None = None, exact_sums: bool = False):
    """q' = clamp(rint(q * ratio), -128, 127) for int8 q [out, in], ratio [out, 1] (exact in cdt).

    Returns (q' int8, clipped, sum over each row of (q' - q*ratio)^2, sum over each row of
    (q*ratio)^2), sums as float64 arrays [out]. Each term is exact. By default the row sums
    accumulate in cdt (relative error ~1e-6: fine for a statistic) and `clipped` is the
    total count; with exact_sums (the mse arm's decision) they accumulate in float64 and
    `clipped` is per row.

    Clipping: rint(x) > 127 <=> x >= 127.5 and rint(x) < -128 <=> x < -128.5 (ties go to
    even: 127.5 -> 128 clips, -128.5 -> -128 does not); clamping before rint is the same as
    after (integer bounds, rint monotone). With every ratio <= 1 nothing can clip. All work
    buffers are reused (a temporary per block would cost fresh pages)."""
    rows, cols = q.shape
    if out is None:
        out = np.empty_like(q)
    clipped = np.zeros(rows, dtype=np.int64) if exact_sums else 0
    sq = np.zeros(rows, dtype=np.float64)
    norm = np.zeros(rows, dtype=np.float64)
    step = max(1, BLOCK_ELEMENTS // max(cols, 1))
    x, r, mask = _scratch(min(step, rows) * cols, cdt)
    x, r, mask = x.reshape(-1, cols), r.reshape(-1, cols), mask.reshape(-1, cols)
    for i in range(0, rows, step):
        n = min(step, rows - i)
        xb, rb, mb = x[:n], r[:n], mask[:n]
        np.copyto(xb, q[i : i + n], casting="unsafe")  # int8 -> float: exact
        np.multiply(xb, ratio[i : i + n], out=xb)  # exact (see module docstring)
        norm[i : i + n] = _row_dots(xb, exact_sums)
        src = xb
        if ratio[i : i + n].max(initial=0) > 1:
            np.greater_equal(xb, 127.5, out=mb)
            hi = np.count_nonzero(mb, axis=1) if exact_sums else np.count_nonzero(mb)
            np.less(xb, -128.5, out=mb)
            lo = np.count_nonzero(mb, axis=1) if exact_sums else np.count_nonzero(mb)
            if exact_sums:
                clipped[i : i + n] = hi + lo
            else:
                clipped += int(hi) + int(lo)
            if np.any(hi) or np.any(lo):
                np.clip(xb, -128, 127, out=rb)
                src = rb
        np.rint(src, out=rb)  # round half to even
        np.copyto(out[i : i + n], rb, casting="unsafe")  # integers in [-128, 127]: exact
        np.subtract(rb, xb, out=xb)
        sq[i : i + n] = _row_dots(xb, exact_sums)
    return out, clipped, sq, norm


class Requantizer:
    """One Linear under one arm, fed blocks of rows: the streaming form of
    requantize_with_stats (which is exactly this, fed the whole weight at once).

    The converter feeds cache-sized blocks as it reads them, so each block is read,
    hashed, requantized and written while it is still in the CPU cache. Every arm is
    row-independent (one scale per output channel), so blocks give the same bytes as the
    whole tensor.

        rq = Requantizer(scale, arm, cols)      # checks the scale, picks exponents
        q_block_new = rq.rows(q_block, start)   # int8 numpy [n, cols], rows start..start+n
        s_new, stats = rq.finish()              # after every row was fed exactly once
    """

    def __init__(self, scale: torch.Tensor, arm: str, cols: int):
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
        if scale.dtype not in SCALE_DTYPES:
            raise ValueError(f"scale dtype {scale.dtype} is not bf16, fp16 or fp32")
        if scale.dim() != 2 or scale.shape[1] != 1:
            raise ValueError(f"scale shape {list(scale.shape)} is not [out, 1]")
        s = scale.to(torch.float64)
        if not bool((torch.isfinite(s) & (s > 0)).all()):
            raise ValueError("scales must be finite and positive")
        self.arm, self.scale, self.cols = arm, scale, cols
        self.rows_total = scale.shape[0]
        self.stats = LinearStats(rows=self.rows_total, cols=cols)
        self.cdt = _compute_dtype(scale.dtype)
        self.s64 = s.reshape(-1).numpy()
        self._fed = 0
        self._tmp = None
        if arm in ("nearest", "ceiling", "probe"):
            self.e = nearest_exponent(scale) if arm in ("nearest", "probe") else ceil_exponent(scale)
            self.s_new = pow2_scale(self.e, scale.dtype)
            self.sn64 = self.s_new.to(torch.float64).reshape(-1).numpy()
            self.ratio = (self.s64 / self.sn64).reshape(-1, 1).astype(self.cdt)  # exact: exponent shift only
        elif arm == "mse":
            e_ceil = ceil_exponent(scale)
            self.candidates = []
            for off in MSE_OFFSETS:
                e_c = e_ceil + off
                # per channel: a power of two the dtype cannot hold is no candidate for that
                # channel only (ratio 1 there is a placeholder; its error is set to inf)
                sc64, ok = pow2_candidates(e_c, scale.dtype)
                ratio = np.where(ok, self.s64 / sc64, 1.0).reshape(-1, 1).astype(self.cdt)
                self.candidates.append((e_c.reshape(-1).numpy(), sc64, ok, ratio))
            self.best_e = e_ceil.reshape(-1).numpy().copy()

    def rows(self, q: np.ndarray, start: int, out: np.ndarray | None = None) -> np.ndarray:
        """q' for rows [start, start + len(q)); q is int8 numpy [n, cols] and is not
        modified. Returns `out` (allocated if None), or q itself for unconstrained and probe."""
        n = q.shape[0]
        if q.dtype != np.int8 or q.ndim != 2 or q.shape[1] != self.cols or start < 0 or start + n > self.rows_total:
            raise ValueError(
                f"rows {start}..{start + n} of shape {list(q.shape)} {q.dtype} do not fit [{self.rows_total}, {self.cols}] int8"
            )
        self._fed += n
        sl = slice(start, start + n)
        st = self.stats
        if self.arm == "unconstrained":
            return q
        if self.arm == "probe":
            qsq = _row_sq(q)
            st.sq_norm += float(np.dot(self.s64[sl] ** 2, qsq))
            st.sq_error += float(np.dot((self.sn64[sl] - self.s64[sl]) ** 2, qsq))
            return q
        if out is None:
            out = np.empty_like(q)
        if self.arm in ("nearest", "ceiling"):
            _, clipped, sq, norm = _requantize_rows(q, self.ratio[sl], self.cdt, out=out)
            w = self.sn64[sl] ** 2
            st.weights_clipped += int(clipped)
            st.sq_error += float(np.dot(w, sq))
            st.sq_norm += float(np.dot(w, norm))  # (q r)^2 s'^2 = (q s)^2
            return out
        # mse: every candidate on this block, keep the best per row
        if self._tmp is None or self._tmp.size < q.size:
            self._tmp = np.empty(q.size, dtype=np.int8)
        tmp = self._tmp[: q.size].reshape(q.shape)
        best_err = np.full(n, np.inf)
        best_clip = np.zeros(n, dtype=np.int64)
        best_e = self.best_e[sl]
        row_norm = np.full(n, np.nan)  # sum of (q s)^2 per row, from its first valid candidate
        for e_c, sc64, ok, ratio in self.candidates:
            _, clipped, sq, norm = _requantize_rows(q, ratio[sl], self.cdt, out=tmp, exact_sums=True)
            valid = ok[sl]
            w = sc64[sl] ** 2
            take = valid & np.isnan(row_norm)
            row_norm[take] = (w * norm)[take]
            err = np.where(valid, w * sq, np.inf)
            better = err < best_err  # strict: earlier candidates win ties
            if better.any():
                out[better] = tmp[better]
                best_err[better] = err[better]
                best_clip[better] = clipped[better]
                best_e[better] = e_c[sl][better]
        # a row with no valid candidate keeps e_ceil, and finish() refuses it (not representable)
        st.weights_clipped += int(best_clip.sum())
        st.sq_error += float(best_err[np.isfinite(best_err)].sum())
        st.sq_norm += float(row_norm[~np.isnan(row_norm)].sum())
        return out

    def finish(self) -> tuple[torch.Tensor, LinearStats]:
        """(s' in the scale's dtype [out, 1], stats), once every row has been fed."""
        if self._fed != self.rows_total:
            raise ValueError(f"fed {self._fed} rows of {self.rows_total}")
        st = self.stats
        if self.arm == "unconstrained":
            return self.scale, st
        if self.arm == "mse":
            e = torch.from_numpy(self.best_e).reshape(self.scale.shape)
            s_new = pow2_scale(e, self.scale.dtype)
        else:
            e, s_new = self.e, self.s_new
        st.scales_changed = int((s_new.to(torch.float64) != self.scale.to(torch.float64)).sum())
        st.exponent_shifts = shift_histogram(e, self.scale)
        return s_new, st


def requantize_with_stats(
    q: torch.Tensor, scale: torch.Tensor, arm: str, *, out: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor, LinearStats]:
    """(q', s', stats) for one Linear under `arm` (see the module docstring).

    out: optional int8 numpy buffer of at least q.numel() elements to write q' into; q'
    then views it. q itself is never modified (unconstrained and probe return it)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    check_inputs(q, scale)
    rq = Requantizer(scale, arm, q.shape[1])
    qn = q.contiguous().numpy()
    buf = None if out is None else out[: qn.size].reshape(qn.shape)
    qn_new = rq.rows(qn, 0, buf)
    s_new, stats = rq.finish()
    return (q if qn_new is qn else torch.from_numpy(qn_new)), s_new, stats


def requantize(q: torch.Tensor, scale: torch.Tensor, arm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q' int8 [out, in], s' [out, 1] in scale's dtype) for one Linear under `arm`."""
    q_new, s_new, _ = requantize_with_stats(q, scale, arm)
    return q_new, s_new
