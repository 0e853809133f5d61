"""The exact reference for W8A8 GEMMs: the oracle that every other backend is checked
against, bit for bit. Runs on CPU (CI) or on a GPU, wherever its inputs live.

Contract (shared by every backend in kernels/):
  a    int8  [M, K]   per-token quantized activations (see quantize_activations)
  w    int8  [N, K]   per-output-channel quantized weights (may contain -128)
  s_a  fp32  [M, 1]   activation scales
  s_w  fp32  [N, 1]   weight scales (a bf16 checkpoint scale upcast exactly)
  ->   bf16  [M, N]

Proof that the oracle is exact: docs/kernels.md#why-the-oracle-is-exact.
"""

import math
from fractions import Fraction

import torch

from requant.kernels.bf16 import round_fp32_to_bf16

# |acc| <= K * 128 * 128 must stay below 2**31.
MAX_K = (2**31 - 1) // (128 * 128)


_OPERAND_DTYPES = (("a", torch.int8), ("w", torch.int8), ("s_a", torch.float32), ("s_w", torch.float32))


def check_operands(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> None:
    """Raise ValueError/TypeError naming the operand that breaks the contract.

    Host metadata only (no device synchronization); every GEMM call runs it, so the common
    case is one short test and the messages are built only on failure.
    """
    if (
        a.dtype is torch.int8
        and w.dtype is torch.int8
        and s_a.dtype is torch.float32
        and s_w.dtype is torch.float32
        and a.dim() == 2
        and w.dim() == 2
    ):
        m, k = a.shape
        n, k2 = w.shape
        dev = a.device
        if (
            k == k2
            and k <= MAX_K
            and s_a.shape == (m, 1)
            and s_w.shape == (n, 1)
            and w.device == dev
            and s_a.device == dev
            and s_w.device == dev
        ):
            return
    _explain_operands(a, w, s_a, s_w)


def _explain_operands(a, w, s_a, s_w) -> None:
    for name, t, dt in zip(("a", "w", "s_a", "s_w"), (a, w, s_a, s_w), (d for _, d in _OPERAND_DTYPES)):
        if t.dtype != dt:
            raise TypeError(f"{name} must be {dt}, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    m, k = a.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, w is {tuple(w.shape)}")
    if tuple(s_a.shape) != (m, 1):
        raise ValueError(f"s_a must be [{m}, 1], got {tuple(s_a.shape)}")
    if tuple(s_w.shape) != (n, 1):
        raise ValueError(f"s_w must be [{n}, 1], got {tuple(s_w.shape)}")
    if k > MAX_K:
        raise ValueError(f"K={k} exceeds {MAX_K}: an int32 accumulator could overflow")
    devices = {t.device for t in (a, w, s_a, s_w)}
    raise ValueError(f"operands on several devices: {sorted(map(str, devices))}")


def accumulate(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact int32 accumulator [M, N] (float64 matmul; exact, see module docstring)."""
    if a.shape[1] > MAX_K:
        raise ValueError(f"K={a.shape[1]} exceeds {MAX_K}")
    acc = a.to(torch.float64) @ w.to(torch.float64).T
    return acc.to(torch.int32)


def accumulate_int64(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The same accumulator computed in int64 arithmetic (slow; the cross-check)."""
    a64 = a.to(torch.int64)
    w64 = w.to(torch.int64)
    out = torch.zeros(a.shape[0], w.shape[0], dtype=torch.int64, device=a.device)
    step = 256  # bounded temporaries: [M, N, step] products at a time
    for k0 in range(0, a.shape[1], step):
        out += (a64[:, None, k0 : k0 + step] * w64[None, :, k0 : k0 + step]).sum(dim=2)
    return out


def scale_row(s_w: torch.Tensor) -> torch.Tensor:
    """The weight scales as the epilogue multiplies them: [N, 1] (or [N]) as a [1, N] row broadcast
    down the output; a grouped [R, N, 1] (the audit's expert Linears of one shape evaluated together,
    audit/batched.py: each output row its own Linear's scales) as [R, N]. Elementwise either way,
    so every output element sees the same fp32 operations."""
    return s_w[..., 0] if s_w.dim() == 3 else s_w.reshape(1, -1)


def epilogue_cutlass_order(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """bf16_rne(s_a * fp32(s_w * fp32(acc))), s_w broadcast along rows of the output."""
    inner = scale_row(s_w) * acc.to(torch.float32)
    return round_fp32_to_bf16(s_a.reshape(-1, 1) * inner)


def epilogue_triton_order(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """bf16_rne(fp32(s_a * fp32(acc)) * s_w)."""
    inner = s_a.reshape(-1, 1) * acc.to(torch.float32)
    return round_fp32_to_bf16(inner * scale_row(s_w))


def epilogue_fused_order(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """bf16_rne(fp32(acc) * fp32(s_a * s_w)): the scale product first, one [M, N] fp32 tensor."""
    scale = s_a.reshape(-1, 1) * scale_row(s_w)
    return round_fp32_to_bf16(acc.to(torch.float32) * scale)


def _round_fraction_to_bf16(v: Fraction) -> float:
    """Round an exact rational once to bf16 (ties to even); returns that value as float."""
    if v == 0:
        return 0.0
    sign = -1 if v < 0 else 1
    x = abs(v)
    # With p, q the bit lengths of numerator and denominator, 2**(p-1) <= num < 2**p and
    # 2**(q-1) <= den < 2**q, so for e = p - q: 2**(e-1) < x < 2**(e+1). One adjustment
    # gives 2**e <= x < 2**(e+1).
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    elif Fraction(2) ** (e + 1) <= x:
        e += 1
    spacing = Fraction(2) ** (max(e, -126) - 7)  # bf16: 8 significant bits, min normal 2**-126
    q = round(x / spacing)  # Fraction.__round__ rounds half to even
    out = q * spacing
    if out >= Fraction(2) ** 128:
        return sign * float("inf")
    return sign * float(out)


def epilogue_exact(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """bf16 of the real number acc * s_a * s_w, rounded once (ties to even)."""
    a64 = acc.to(torch.float64)
    sa = s_a.reshape(-1, 1).to(torch.float64)
    sw = scale_row(s_w).to(torch.float64)
    v = (a64 * sa) * sw
    # Decide in float64 directly: scale to 8 integer bits and round half to even.
    _, exp = torch.frexp(v)
    exp = torch.clamp(exp, min=-125)  # fixed spacing in the subnormal range
    t = torch.ldexp(v, 8 - exp)  # |t| in [128, 256) for normal values
    frac = (t - torch.floor(t)).abs()
    # float64 error of v is < 2**-51 relative, i.e. < 2**-43 in units of t.
    risky = (frac - 0.5).abs() <= 2.0**-42
    rounded = torch.ldexp(torch.round(t), exp - 8)  # torch.round: half to even
    rounded = torch.where(torch.isfinite(v), rounded, v)
    out = rounded.to(torch.bfloat16)  # exact: at most 8 significant bits (or overflow to inf)
    if bool(risky.any()):
        rows, cols = risky.nonzero(as_tuple=True)
        # One gather and one transfer per operand (not one device read per element).
        accs = acc[rows, cols].tolist()
        sas = s_a.reshape(-1)[rows].tolist()  # fp32 -> Python float: exact
        sws = (s_w[rows, cols, 0] if s_w.dim() == 3 else s_w.reshape(-1)[cols]).tolist()
        fixed = [
            _round_fraction_to_bf16(Fraction(int(c)) * Fraction(sa_) * Fraction(sw_))
            for c, sa_, sw_ in zip(accs, sas, sws)
        ]
        out[rows, cols] = torch.tensor(fixed, dtype=torch.float64, device=out.device).to(torch.bfloat16)
    return out


def scaled_mm_cutlass_order(a, w, s_a, s_w):
    check_operands(a, w, s_a, s_w)
    return epilogue_cutlass_order(accumulate(a, w), s_a, s_w)


def scaled_mm_triton_order(a, w, s_a, s_w):
    check_operands(a, w, s_a, s_w)
    return epilogue_triton_order(accumulate(a, w), s_a, s_w)


def scaled_mm_fused_order(a, w, s_a, s_w):
    check_operands(a, w, s_a, s_w)
    return epilogue_fused_order(accumulate(a, w), s_a, s_w)


def scaled_mm_exact(a, w, s_a, s_w):
    check_operands(a, w, s_a, s_w)
    return epilogue_exact(accumulate(a, w), s_a, s_w)


# Activation dtypes both quantize_activations accept: each upcasts to fp32 exactly, so
# "finite" means the same before and after the upcast (float64 1e300 would not).
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Rows whose absmax is below TINY are scaled by 1/TINY before the inverse is taken (exact:
# a power of two), so that 127 / absmax never overflows; see quantize_activations.
TINY = 2.0**-64
DEN_FLOOR = 2.0**-100  # quantize_activations: a zero row's denominator (below every other row's)


# s of a row that holds a NaN or an infinity when nothing refused it (check=False, or a GPU
# tensor with check=None): a quiet NaN with these bits, and q = 0 for the whole row, so every
# output of that token is NaN instead of finite garbage. The Triton kernel writes the same.
POISON_SCALE_BITS = 0x7FC00000


def _check_activations(x: torch.Tensor, check: bool | None = None) -> bool:
    """The activation contract shared by every quantize_activations backend: 2-D,
    bf16/fp16/fp32, finite. Raises ValueError/TypeError.

    The finiteness check reads every element on the host: free for a CPU tensor, a device
    synchronization for a GPU tensor (the eager runtime calls this once per layer). So
    `check=None` (the default) checks CPU tensors only; GPU tensors are checked on the device
    instead, without a sync: a row with a NaN or an infinity gets s = NaN (POISON_SCALE_BITS)
    and q = 0. `check=True` refuses NaN/inf on any device (one sync on a GPU); `check=False`
    never reads the values on the host. Returns whether the values were checked.
    """
    if x.dim() != 2:
        raise ValueError(f"activations must be 2-D [tokens, features], got {tuple(x.shape)}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"activations must be bfloat16, float16 or float32, got {x.dtype}")
    if check is None:
        check = x.device.type == "cpu"
    if check and not bool(torch.isfinite(x).all()):
        raise ValueError("activations contain NaN or infinity")
    return bool(check)


def quantize_activations(x: torch.Tensor, check: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8 quantization, the operands both kernels share.

    Input: x [M, K] bf16, fp16 or fp32 (upcast to fp32 exactly), finite; anything else
    is refused (_check_activations, shared with the Triton backend). `check` says where
    NaN/inf are refused (see _check_activations); rows that hold one and were not refused
    give s = NaN (POISON_SCALE_BITS) and q = 0.
      absmax = max_k |x[m, k]|                 (exact)
      s      = fp32(absmax / 127)              (one IEEE division; may be subnormal, and is 0
                                                for fp32 rows with absmax <= 127 * 2**-150,
                                                ~8.9e-44, while their q is still exact)
      inv    = 127 / absmax rounded to fp32's 24-bit significand *as if the exponent
               range were unbounded*
      q      = saturate_int8(round_half_even(fp32(x * inv)))
    For absmax >= 2**-64 that inv is the plain IEEE fp32(127 / absmax). Below
    127 / FLT_MAX ~ 3.7e-37 (normal bf16 values reach there) the plain division would
    overflow to inf, and 0 * inf = NaN; so rows with absmax < TINY = 2**-64 are computed
    as fp32(x * 2**64) * fp32(127 / (absmax * 2**64)): both scalings are exact (also for
    subnormal x) and each rounding happens at the same relative place, so q is the
    formula above, bit for bit, whichever threshold is used. Such rows keep all their
    information: q spans [-127, 127] like any other row.
    A zero row gives s = 0 and q = 0 (no division by zero, no NaN).
    Returns (q int8 [M, K], s fp32 [M, 1]).
    """
    checked = _check_activations(x, check)
    xf = x.to(torch.float32)
    absmax = xf.abs().amax(dim=1, keepdim=True) if xf.shape[1] else torch.zeros(xf.shape[0], 1, device=xf.device)
    # Few launches (the reference engine quantizes every layer's inputs on the GPU too); each step
    # gives the formula's bits: a zero row's s is 0 / 127 = +0 and its q is (+-0) * finite = 0 (the
    # denominator floor DEN_FLOOR = 2**-100 lies below every nonzero absmax * up >= 2**-149 * 2**64,
    # so it moves no other row, and 127 / 2**-100 is finite).
    up = torch.where(absmax < TINY, 1.0 / TINY, 1.0).to(torch.float32)  # float32 whatever the default dtype
    # Both divisions tensor / tensor: `127.0 / t` is t.reciprocal() * 127 in torch (two
    # roundings), and on CUDA `t / 127.0` with a CPU scalar multiplies by 1/127; only a
    # tensor divisor gives the one IEEE division that the contract names.
    c127 = torch.full_like(absmax, 127.0)
    s = absmax / c127
    inv = c127 / (absmax * up).clamp_min_(DEN_FLOOR)
    q = torch.round((xf * up) * inv).clamp_(-128, 127).to(torch.int8)
    if not checked:  # no host read: mark rows with NaN/inf on the device (see POISON_SCALE_BITS)
        ok = absmax < math.inf  # False for a row with a NaN (amax propagates it) or an infinity
        # torch.full, not torch.tensor(..., device=cuda): a host-to-device copy waits for the stream
        poison = torch.full((), POISON_SCALE_BITS, dtype=torch.int32, device=xf.device).view(torch.float32)
        s = torch.where(ok, s, poison)
        q = q.mul_(ok)
    return q, s
