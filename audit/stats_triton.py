"""One pass over a chunk of cells' outputs for the batched statistics (audit/batched_stats.py's cell_stats).

For every (cell, row) of ys [C, R, N] (bf16) against ref [R, N] the kernel reads each element
once and returns int32 [C, R, 32]:

    [0]       mismatching elements (int16 bit patterns differ)
    [1 + j]   non-NaN elements whose ULP distance d has floor(log2 d) = j, j = 0..16 (d >= 2**16: 16)
    [18]      elements that are NaN on either side
    [30]      the largest non-NaN d

with the torch path's definitions: d = |ord(y) - ord(ref)|, ord(b) = b for b < 0x8000 else
0x8000 - b on the 16 bits (scoring's ulp distance); floor(log2 d) from the float32 exponent of d
(exact: d < 2**17); NaN = exponent all ones, mantissa non-zero (torch.isnan on bf16). The bins are
counted by comparing each element's bin with all 32 (a [BLOCK, 32] sum): no atomics. The torch
formulation (audit/batched_stats.py: _row_hist) is the definition it is tested against, bit for bit,
under Triton's interpreter on the CPU (tests/audit/test_stats_triton.py) and on a GPU.
"""

from __future__ import annotations

import torch

NB = 32
SLOT_NEQ, SLOT_NAN, SLOT_MAX = 0, 18, 30
_KERNEL = None


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["R"])  # R only picks the reference row: one build for every M
    def stats_kernel(y_ptr, ref_ptr, out_ptr, R, N, BLOCK: tl.constexpr, NBINS: tl.constexpr):
        pid = tl.program_id(0)  # cell * R + row
        row = pid % R
        y_row = y_ptr + pid.to(tl.int64) * N
        r_row = ref_ptr + row.to(tl.int64) * N
        lanes = tl.arange(0, BLOCK)
        bins = tl.arange(0, NBINS)
        ne = tl.zeros([BLOCK], dtype=tl.int32)
        mx = tl.zeros([BLOCK], dtype=tl.int32)
        hist = tl.zeros([NBINS], dtype=tl.int32)
        for n0 in range(0, N, BLOCK):
            offs = n0 + lanes
            m = offs < N
            by = tl.load(y_row + offs, mask=m, other=0).to(tl.int32) & 0xFFFF
            bx = tl.load(r_row + offs, mask=m, other=0).to(tl.int32) & 0xFFFF
            ne += (by != bx).to(tl.int32)
            oy = tl.where(by >= 0x8000, 0x8000 - by, by)
            ox = tl.where(bx >= 0x8000, 0x8000 - bx, bx)
            nan = ((by & 0x7FFF) > 0x7F80) | ((bx & 0x7FFF) > 0x7F80)
            d = tl.where(nan, 0, tl.abs(oy - ox))
            mx = tl.maximum(mx, d)
            e = d.to(tl.float32).to(tl.int32, bitcast=True) >> 23  # 0 for d = 0, else 127 + floor(log2 d)
            b = tl.where(e > 0, tl.minimum(e - 126, 17), 0)  # 1 + floor(log2 d), capped at 1 + 16
            b = tl.where(nan, 18, b)  # SLOT_NAN
            b = tl.where(m, b, 0)  # slot 0 collects d = 0 and the masked lanes: overwritten below
            hist += tl.sum((b[:, None] == bins[None, :]).to(tl.int32), axis=0)
        vec = tl.where(bins == 0, tl.sum(ne, axis=0), hist)
        vec = tl.where(bins == 30, tl.max(mx, axis=0), vec)  # SLOT_MAX
        tl.store(out_ptr + pid.to(tl.int64) * NBINS + bins, vec)

    return stats_kernel


def row_stats(ys: torch.Tensor, ref: torch.Tensor, block: int = 256) -> torch.Tensor:
    """int32 [C, R, 32] (slots above) for bf16 ys [C, R, N] against bf16 ref [R, N]; one launch."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _kernel()
    c, r, n = ys.shape
    out = torch.empty(c, r, NB, dtype=torch.int32, device=ys.device)
    if c * r == 0:
        return out
    y16 = ys.contiguous().view(torch.int16)
    r16 = ref.contiguous().view(torch.int16)
    _KERNEL[(c * r,)](y16, r16, out, r, n, BLOCK=block, NBINS=NB)
    return out
