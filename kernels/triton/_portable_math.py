"""The portable arithmetic's device functions, shared by kernels/triton/portable.py and the
attention and row kernels that take a portable variant (a `tl.constexpr` switch):

    exp2_p(x), exp_p(x)   software exp2 / exp from IEEE fp32 operations (kernels.portable.exp2, exp)
    OPTIONS               the compile options of every portable launch (no FMA contraction, no
                          flush-to-zero in libdevice)

docs/runtime.md, "The portable arithmetic".
"""

import triton
import triton.language as tl

from requant.kernels import portable as spec

__all__ = ["OPTIONS", "exp2_p", "exp_p"]

OPTIONS = {"enable_fp_fusion": False}
try:  # libdevice without flush-to-zero (the option exists in recent Triton only)
    from triton.backends.nvidia.compiler import CUDAOptions

    if "enable_reflect_ftz" in CUDAOptions.__dataclass_fields__:
        OPTIONS["enable_reflect_ftz"] = False
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    pass
_LN2 = tl.constexpr(spec.LN2)
_LOG2E = tl.constexpr(spec.LOG2E)
_LN2_HI = tl.constexpr(spec.LN2_HI)
_LN2_LO = tl.constexpr(spec.LN2_LO)
_TINY_ARG = tl.constexpr(spec.TINY_ARG)
_NAN = tl.constexpr(spec.CANONICAL_NAN)
C9 = tl.constexpr(spec.EXP_POLY[0])
C8 = tl.constexpr(spec.EXP_POLY[1])
C7 = tl.constexpr(spec.EXP_POLY[2])
C6 = tl.constexpr(spec.EXP_POLY[3])
C5 = tl.constexpr(spec.EXP_POLY[4])
C4 = tl.constexpr(spec.EXP_POLY[5])
C3 = tl.constexpr(spec.EXP_POLY[6])
C2 = tl.constexpr(spec.EXP_POLY[7])
C1 = tl.constexpr(spec.EXP_POLY[8])
C0 = tl.constexpr(spec.EXP_POLY[9])


@triton.jit
def _finish(x, k, r):
    p = r * 0.0 + C9
    p = p * r
    p = p + C8
    p = p * r
    p = p + C7
    p = p * r
    p = p + C6
    p = p * r
    p = p + C5
    p = p * r
    p = p + C4
    p = p * r
    p = p + C3
    p = p * r
    p = p + C2
    p = p * r
    p = p + C1
    p = p * r
    p = p + C0
    kc = tl.where(k < -125.0, -125.0, tl.where(k > 127.0, 127.0, k))
    kc = tl.where(k != k, 0.0, kc)
    scale = ((kc.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    y = p * scale
    y = tl.where(k < -125.0, 0.0, y)
    y = tl.where(k > 127.0, float("inf"), y)
    nan = tl.full(x.shape, _NAN, tl.int32).to(tl.float32, bitcast=True)
    return tl.where(x != x, nan, y)


@triton.jit
def exp2_p(x):
    """kernels.portable.exp2, operation for operation."""
    xs = tl.where(tl.abs(x) < _TINY_ARG, 0.0, x)
    k = tl.floor(xs)
    f = xs - k
    r = f * _LN2
    return _finish(x, k, r)


@triton.jit
def exp_p(x):
    """kernels.portable.exp, operation for operation."""
    xs = tl.where(tl.abs(x) < _TINY_ARG, 0.0, x)
    k = tl.floor(xs * _LOG2E)
    r = xs - k * _LN2_HI
    r = r - k * _LN2_LO
    return _finish(x, k, r)
