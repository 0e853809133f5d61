"""Per-token activation quantization in Triton: the int8 operands both GEMMs share.

Numerics (equal, bit for bit, to kernels.reference.quantize_activations, whose docstring
states the contract):
  absmax = max_k |x[m, k]|               (x upcast to fp32 exactly; max is exact)
  up     = 2**64 if absmax < 2**-64 else 1   (exact scaling: 127 / absmax cannot overflow)
  s_a    = fp32(absmax / 127)            IEEE division: tl.math.div_rn, because a plain
  inv    = fp32(127 / (absmax * up))     `/` may lower to an approximate division on GPU
  q      = saturate_int8(round_half_even(fp32(fp32(x * up) * inv)))
  a zero row gives s_a = 0 and q = 0 (inv is forced to 0: no 0/0, no NaN).
Inputs pass the reference's own host check (kernels.reference._check_activations); a row with
a NaN or an infinity that it did not refuse gets s = NaN and q = 0, decided in the kernel.

Why bf16 is upcast on its bits, how round_half_even is written, why enable_fp_fusion=False,
and what the input checks cost: docs/kernels.md#numerics, docs/kernels.md#why-the-oracle-is-exact.
"""

import torch
import triton
import triton.language as tl

from requant.kernels.reference import POISON_SCALE_BITS, TINY, _check_activations
from requant.kernels.triton import _launch

# One program per token; the row is read twice (absmax, then quantize) in blocks of
# BLOCK_K elements. Qwen3 rows (K <= 17408) stay in L2 between the passes.
BLOCK_K = 1024
NUM_WARPS = 4
_TINY = tl.constexpr(TINY)
_UP = tl.constexpr(1.0 / TINY)
_POISON = tl.constexpr(POISON_SCALE_BITS)
_INF = tl.constexpr(float("inf"))


@triton.jit
def _round_half_even(v):
    f = tl.floor(v)
    d = v - f  # exact for |v| < 2**23
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (d > 0.5) | ((d == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def activation_scales(amax):
    # The per-row scale arithmetic every quantizer shares (the module docstring's formulas), on the
    # row's exact absmax (scalar or [R]): s = absmax / 127, inv = 127 / (absmax * up) with IEEE
    # divisions, up = 2**64 for tiny rows (a power of two: exact); a zero row gives s = inv = 0.
    zero = amax == 0.0
    up = tl.where(amax < _TINY, _UP, 1.0)
    safe = tl.where(zero, 1.0, amax)
    s = tl.where(zero, 0.0, tl.math.div_rn(safe, 127.0 + tl.zeros_like(safe)))
    inv = tl.where(zero, 0.0, tl.math.div_rn(127.0 + tl.zeros_like(safe), safe * up))
    return s, up, inv


@triton.jit
def _load_fp32(ptrs, mask, BF16_BITS: tl.constexpr):
    if BF16_BITS:  # int16 view of bf16: the fp32 with the same top 16 bits (exact)
        b = tl.load(ptrs, mask=mask, other=0)
        x = (b.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr, BF16_BITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_xm
    absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    nonfinite = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        x = _load_fp32(x_row + k0 + offs, k0 + offs < K, BF16_BITS)
        absmax = tl.maximum(absmax, tl.abs(x))
        nonfinite = tl.maximum(nonfinite, ((x != x) | (tl.abs(x) == _INF)).to(tl.int32))
    amax = tl.max(absmax, axis=0)
    bad = tl.max(nonfinite, axis=0) > 0  # NaN or inf in the row: s = NaN, q = 0 (no host check)
    s, up, inv = activation_scales(amax)
    poison = tl.full((), _POISON, tl.int32).to(tl.float32, bitcast=True)
    tl.store(s_ptr + row, tl.where(bad, poison, s))
    q_row = q_ptr + row * stride_qm
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        x = _load_fp32(x_row + k0 + offs, mask, BF16_BITS)
        v = _round_half_even((x * up) * inv)
        v = tl.minimum(tl.maximum(v, -128.0), 127.0)
        v = tl.where(bad, 0.0, v)
        tl.store(q_row + k0 + offs, v.to(tl.int8), mask=mask)


def quantize_activations(
    x: torch.Tensor, check: bool | None = None, cached: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16/fp16/fp32 [M, K] -> (q int8 [M, K], s fp32 [M, 1]); see the module docstring.

    Refuses what kernels.reference.quantize_activations refuses, with the same errors
    (one shared check, the same `check`). Rows with absmax < 2**-64 (tiny, or subnormal)
    are quantized like the reference: 127 / absmax is taken on the row scaled by 2**64
    (exact). `cached=False`: launch through JITFunction every call (see _launch.py).
    """
    index = _launch.device_index(x)  # refuses tensors the backend cannot run on
    _check_activations(x, check)
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)  # the kernel writes every row
    if m == 0:
        return q, s
    if x.stride(1) != 1:
        x = x.contiguous()
    bf16 = x.dtype == torch.bfloat16
    xin = x.view(torch.int16) if bf16 else x
    args = (xin, q, s, k, x.stride(0), q.stride(0))
    consts = {"BLOCK_K": BLOCK_K, "BF16_BITS": bf16}
    key = None
    if cached and index is not None and not _launch.INTERPRET:
        key = _launch.launch_key("quantize", "rows", index, args, (BLOCK_K, bf16))
    # enable_fp_fusion=False keeps x * inv rounded before the half-even rounding (see above)
    _launch.launch(
        _quantize_rows_kernel, (m, 1, 1), args, consts, {"num_warps": NUM_WARPS, "enable_fp_fusion": False}, key, index
    )
    return q, s
