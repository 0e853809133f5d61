"""Per-cell statistics of audit/batched.py on the operands' device: mismatching elements, the
largest bf16 distance, the ULP histogram (scoring.ulp_histogram's bins) and the bitwise/value
comparisons behind C1, C4 and C8, reduced per (cell, segment) without host reads.

On CUDA one Triton pass per chunk of cells (audit/stats_triton.py); elsewhere torch, the same
per-row counts (one comparison and row sum per bin: no atomics). Both equal the per-cell path
(tests/audit/test_batched.py, tests/audit/test_stats_triton.py); docs/audit.md, "Batched evaluation".
"""

from __future__ import annotations

import sys

import torch

from requant.audit.catalogue.scoring import HIST_BINS
from requant.audit.stats_triton import SLOT_MAX, SLOT_NAN, SLOT_NEQ, row_stats


def _ordinal(bits16: torch.Tensor) -> torch.Tensor:
    b = bits16.to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, 0x8000 - b, b)


def seg_reduce(rows: torch.Tensor, seg: torch.Tensor, n_seg: int, how: str) -> torch.Tensor:
    """[C, R] per-row values -> [C, S] per segment (sum or amax)."""
    c = rows.shape[0]
    if n_seg == 1:  # one segment (a prefill): a plain row reduction, one op
        r = rows.to(torch.int64)
        return r.sum(dim=1, keepdim=True) if how == "sum" else r.amax(dim=1, keepdim=True)
    out = torch.zeros(c, n_seg, dtype=torch.int64, device=rows.device)
    if how == "sum":
        return out.index_add_(1, seg, rows.to(torch.int64))
    return out.scatter_reduce_(1, seg.expand(c, -1), rows.to(torch.int64), "amax", include_self=True)


_BIN_BOUNDS: dict = {}
# Host shortcuts (read-backs that cost nothing without a device queue): None = on CPU tensors only;
# False forces the device code path everywhere (the tests run it on the CPU too).
HOST_SHORTCUTS: bool | None = None


def _host(dev: torch.device) -> bool:
    return dev.type == "cpu" if HOST_SHORTCUTS is None else HOST_SHORTCUTS


def cell_stats(
    ys: torch.Tensor, ref: torch.Tensor, seg: torch.Tensor, n_seg: int, subset: bool = True, hist: bool = True
) -> torch.Tensor:
    """[C, S, 2 + HIST_BINS]: mismatching elements, largest bf16 distance (ulp_distance: NaN on
    either side is 2**31) and scoring.ulp_histogram's bins (floor(log2 d) of every d > 0), per cell
    and segment; [C, S, 2] without `hist`."""
    c, r, n = ys.shape
    dev = ys.device
    if _use_triton(dev) and not (_host(dev) and subset):
        rows = _triton_rows(ys, ref)
        if rows is not None:
            return _stats_from_rows(rows, seg, n_seg, hist)
    yb, rb = ys.view(torch.int16), ref.view(torch.int16)
    neq = seg_reduce((yb != rb).sum(dim=2), seg, n_seg, "sum")
    if _host(dev) and subset:  # no device to keep busy: distances only for cells that changed
        changed = (neq > 0).any(dim=1).nonzero().reshape(-1)
        out = torch.zeros(c, n_seg, 2 + HIST_BINS, dtype=torch.int64)
        out[:, :, 0] = neq
        if changed.numel():  # unchanged cells: distance and histogram are never read (not observable)
            out[changed] = cell_stats(ys[changed], ref, seg, n_seg, subset=False)
        return out
    d = (_ordinal(yb) - _ordinal(rb)).abs_()  # int32, <= 2**16 where neither side is NaN
    nan = torch.isnan(ys) | torch.isnan(ref)
    row_max = torch.where(nan.any(dim=2), 2**31, d.amax(dim=2).to(torch.int64))
    mx = seg_reduce(row_max, seg, n_seg, "amax")
    if not hist:
        return torch.stack([neq, mx], dim=2)
    if dev not in _BIN_BOUNDS:
        _BIN_BOUNDS[dev] = torch.tensor([2**j for j in range(1, 17)], dtype=torch.int32, device=dev)
    # floor(log2 d) for 1 <= d <= 2**16 (the number of powers of two 2..2**16 not above d); NaN: 31
    if _host(dev):  # only the changed elements (few); no device to keep busy
        b = torch.bucketize(d, _BIN_BOUNDS[dev], right=True).masked_fill_(nan, 31)
        row_key = (torch.arange(c, device=dev).view(c, 1) * n_seg + seg.view(1, r)) * HIST_BINS  # [C, R]
        keep = (d > 0) | nan
        key = (row_key.unsqueeze(2) + b)[keep]
        hist = torch.bincount(key, minlength=c * n_seg * HIST_BINS).view(c, n_seg, HIST_BINS)
    else:
        hist = _seg_hist(_row_hist(d, nan), seg, n_seg)
    return torch.cat([neq.unsqueeze(2), mx.unsqueeze(2), hist], dim=2)


# The one-pass Triton statistics (audit/stats_triton.py): None = on CUDA; True forces it (the tests,
# under Triton's interpreter on the CPU); False: the torch formulation everywhere.
TRITON_STATS: bool | None = None
_TRITON_FAILED: list = []


def _use_triton(dev: torch.device) -> bool:
    if _TRITON_FAILED:
        return False
    return dev.type == "cuda" if TRITON_STATS is None else TRITON_STATS


def _triton_rows(ys: torch.Tensor, ref: torch.Tensor) -> torch.Tensor | None:
    try:
        return row_stats(ys, ref)
    except Exception as e:  # no Triton, or a kernel this Triton cannot build: the torch formulation
        if TRITON_STATS:
            raise
        _TRITON_FAILED.append(repr(e))
        print(f"note: the Triton statistics pass is unavailable ({e!r:.200}); using the torch one", file=sys.stderr)
        return None


def _stats_from_rows(rows: torch.Tensor, seg: torch.Tensor, n_seg: int, hist: bool) -> torch.Tensor:
    """_stats' [C, S, 2 + HIST_BINS] (or [C, S, 2]) from stats_triton.row_stats' per-row slots."""

    c, r, _ = rows.shape
    rows = rows.to(torch.int64)
    neq = seg_reduce(rows[:, :, SLOT_NEQ], seg, n_seg, "sum")
    row_max = torch.where(rows[:, :, SLOT_NAN] > 0, 2**31, rows[:, :, SLOT_MAX])
    mx = seg_reduce(row_max, seg, n_seg, "amax")
    if not hist:
        return torch.stack([neq, mx], dim=2)
    gap = torch.zeros(c, r, 31 - 17, dtype=torch.int64, device=rows.device)
    tail = torch.zeros(c, r, HIST_BINS - 32, dtype=torch.int64, device=rows.device)
    h = torch.cat([rows[:, :, 1:18], gap, rows[:, :, SLOT_NAN : SLOT_NAN + 1], tail], dim=2)
    return torch.cat([neq.unsqueeze(2), mx.unsqueeze(2), _seg_hist(h, seg, n_seg)], dim=2)


def _row_hist(d: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """[C, R, HIST_BINS] per row: bin j (0..16) counts the non-NaN d with floor(log2 d) = j (d >= 2**16
    in bin 16, as bucketize over 2..2**16 puts it), bin 31 the NaN elements. No atomics (a histogram
    through index_add_ serialises on the one bin that every unchanged element lands in): one
    comparison and one row sum per bin, over the float32 exponent of d (exact: d < 2**24), uint8."""
    c, r, _ = d.shape
    e = (d.to(torch.float32).view(torch.int32) >> 23).to(torch.uint8)  # 0 for d = 0, else 127 + floor(log2 d)
    e.masked_fill_(nan, 0)
    cols = [(e == 127 + j).sum(dim=2) for j in range(16)] + [(e >= 127 + 16).sum(dim=2)]
    gap = torch.zeros(c, r, 31 - len(cols), dtype=torch.int64, device=d.device)
    tail = torch.zeros(c, r, HIST_BINS - 32, dtype=torch.int64, device=d.device)
    return torch.cat([torch.stack(cols, dim=2), gap, nan.sum(dim=2).unsqueeze(2), tail], dim=2)


def _seg_hist(rows: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """[C, R, B] per-row counts -> [C, S, B] per segment."""
    if n_seg == 1:
        return rows.sum(dim=1, keepdim=True)
    c, _, nb = rows.shape
    return torch.zeros(c, n_seg, nb, dtype=torch.int64, device=rows.device).index_add_(1, seg, rows)


def any_diff(x: torch.Tensor, y: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """[S] 0/1: does any element of a segment's rows differ (bitwise, same dtype)?"""
    if x.dtype.is_floating_point:
        x, y = (
            x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]),
            y.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[y.element_size()]),
        )
    ne = (x != y).reshape(x.shape[0], -1).sum(dim=1)
    return (seg_reduce(ne.unsqueeze(0), seg, n_seg, "sum")[0] > 0).to(torch.int64)


def value_diff(acc_test: torch.Tensor, acc: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """C4's comparison: the accumulators as exact values (int32 pairs directly; float64 holds int32
    and bf16/fp32)."""
    if acc_test.dtype == acc.dtype == torch.int32:
        ne = (acc_test != acc).sum(dim=1)
    else:
        ne = (acc_test.to(torch.float64) != acc.to(torch.float64)).sum(dim=1)
    return (seg_reduce(ne.unsqueeze(0), seg, n_seg, "sum")[0] > 0).to(torch.int64)
