"""F6's accumulator (exact 64-wide tile sums added into a bf16 register) in one Triton launch.

audit.faults.accumulate_bf16_tiles, the definition, loops over K / F6_TILE tiles in torch (five
launches per tile: hundreds per Linear). Here each program owns a [BM, BN] block of outputs and
walks the same tiles in the same order:

    part = sum of a[m, k] * w[n, k] over the tile's 64 k   exact: integers < 2**24 in fp32, so
                                                            every partial sum of the ieee dot is exact
    acc  = bf16_rne(fp32(acc + part))                       one IEEE fp32 add, then round to nearest
                                                            even on the bits (kernels/triton/_bf16.py's
                                                            rule, the same under the interpreter)

which is the definition's `(acc + part).to(bfloat16).to(float32)` element by element (no value can
reach a NaN or an infinity: |acc| <= K * 2**14). The tile boundaries are the definition's (k0 =
0, 64, 128, ...; the last tile is masked, zeros adding nothing). Used on CUDA by audit/batched.py;
proof: tests/audit/test_f6_tiles.py (interpreter, CPU) and the GPU equality test.
"""

from __future__ import annotations

import torch

from requant.audit.catalogue.checks import SILENT
from requant.audit.catalogue.faults import F6_TILE, accumulate_bf16_tiles


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def f6_kernel(a_ptr, w_ptr, out_ptr, M, N, K, TILE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        pm = tl.program_id(0)
        pn = tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, TILE)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, TILE):
            ks = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K), other=0)
            w = tl.load(w_ptr + rn[None, :] * K + ks[:, None], mask=(rn[None, :] < N) & (ks[:, None] < K), other=0)
            part = tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            s = acc + part
            u = s.to(tl.int32, bitcast=True)
            u = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
            acc = u.to(tl.float32, bitcast=True)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return f6_kernel


_KERNEL = None


def accumulate_bf16_tiles_triton(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """accumulate_bf16_tiles(a, w) (fp32 [M, N] holding bf16 values) in one launch."""
    global _KERNEL
    import triton

    if _KERNEL is None:
        _KERNEL = _kernel()
    m, k = a.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    bm = 16 if m <= 16 else (32 if m <= 32 else 64)
    bn = 64
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _KERNEL[grid](a.contiguous(), w.contiguous(), out, m, n, k, TILE=F6_TILE, BM=bm, BN=bn)
    return out


def f6_accumulator(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The Triton kernel on CUDA (when Triton imports), the torch definition elsewhere."""
    if a.device.type == "cuda":
        try:
            return accumulate_bf16_tiles_triton(a, w)
        except ImportError:
            pass
    return accumulate_bf16_tiles(a, w)


# From three tiles on, whether some output moves by more than one spacing is chance per element
# (measured on random operands: 9% of the elements at K = 192, 25% at K = 1024): the matrix's
# 'fire' is claimed from this many outputs (M * N) on, where staying within one spacing everywhere
# has odds below 1e-40; below, no claim.
C6_MIN_OUTPUTS = 1024


def c6_expected(shape: tuple[int, int, int], expected: str) -> str | None:
    """What C6 (more than one spacing) does on F6 for a Linear of shape (M, K, N): the matrix's cell
    refined by the tile count of K and the number of outputs. One tile (K <= F6_TILE): the register
    holds the exact sum rounded once to bf16 (relative error <= 2**-9, under half a spacing of the
    product whatever the scales), so the output moves by at most one spacing: silent. Two tiles: the
    first tile's rounding plus the sum's is about one spacing, and more only where the second tile
    cancels the first (1.8% of the elements at K = 65; none where the first tile dominates): no
    claim (None). Three or more with fewer than C6_MIN_OUTPUTS outputs (a decode row of a narrow
    Linear): no claim. Otherwise the matrix's cell."""
    m, k, n = shape
    tiles = -(-k // F6_TILE)
    if tiles <= 1:
        return SILENT
    return None if tiles == 2 or m * n < C6_MIN_OUTPUTS else expected
