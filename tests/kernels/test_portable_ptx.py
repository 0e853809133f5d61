"""The portable engine's GPU kernels, compiled for sm_90a here (no GPU needed), contain no instruction
whose result the hardware may approximate or flush: no `.approx`, no `.ftz`, no hardware ex2/lg2/sin/
cos/rsqrt, no fp32 fma (the spec rounds every product on its own), no tensor-core mma.

Reference: the PTX itself, as the compiler emits it for the options each launch uses. The control:
the fast engine's SiLU (PORTABLE=False, the device's exp) must show `ex2.approx`, so the scan can see
what it forbids. The kernels' bits against the CPU specification are tested on the GPU
(tests/requant/runtime/test_portable_gpu.py); this test pins what those bits could depend on.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("triton.backends.nvidia.compiler")

_SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import requant.kernels.triton.attention as A
import requant.kernels.triton.fused as F
import requant.kernels.triton.portable as P
import requant.kernels.triton.quantize as Q

TARGET = GPUTarget("cuda", 90, 32)
bf, i16, i8, f32, i32 = "*bf16", "*i16", "*i8", "*fp32", "*i32"


def ptx(fn, types, consts, opts):
    sig = {n: ("constexpr" if n in consts else types[n]) for n in fn.arg_names}
    ck = triton.compile(ASTSource(fn, sig, constexprs=consts), target=TARGET, options=opts)
    lines = [l.split("//")[0] for l in ck.asm["ptx"].splitlines()]
    return "\n".join(l for l in lines if not re.match(r"\s*\.(loc|file|section)\b", l))


H, KV, D = 16, 8, 128
G, bm = H // KV, P.block_m(H, KV)
po = dict(P.OPTIONS, num_warps=4)
fo = dict(F.OPTIONS, num_warps=4)
split_t = dict(q_ptr=i16, k_ptr=i16, v_ptr=i16, m_ptr=f32, l_ptr=f32, acc_ptr=f32, pos_ptr=i32, blocks_ptr=i32,
               blk0="i32", nsplit="i32", cap="i32", qk_scale="fp32")
comb_t = dict(m_ptr=f32, l_ptr=f32, acc_ptr=f32, o_ptr=i16, pos_ptr=i32, blocks_ptr=i32, blk0="i32", nsplit="i32")
silu_t = dict(gu_ptr=i16, act_ptr=i16, q_ptr=i8, s_ptr=f32, n="i32")
rms_t = dict(x_ptr=i16, d_ptr=i16, w_ptr=i16, h_ptr=i16, q_ptr=i8, s_ptr=f32, rows_ptr=i32, n="i32", eps="fp32")
rope_t = dict(qkv_ptr=i16, qw_ptr=i16, kw_ptr=i16, cos_ptr=f32, sin_ptr=f32, pos_ptr=i32, rows_ptr=i32, kc_ptr=i16,
              vc_ptr=i16, q_ptr=i16, cap="i32", eps="fp32")
quant_t = dict(x_ptr=i16, q_ptr=i8, s_ptr=f32, K="i32", stride_xm="i32", stride_qm="i32")
dense_t = dict(x_ptr=i16, w_ptr=i16, o_ptr=f32, M="i32", N="i32", K="i32")
out = {
    "split": ptx(A._split_kernel, split_t, dict(H=H, KV=KV, D=D, G=G, BLOCK_M=bm, BLOCK_N=16, SPLIT=512,
                 INTERPRET=False, LANES=32, PORTABLE=True), po),
    "combine": ptx(A._combine_kernel, comb_t, dict(H=H, KV=KV, D=D, G=G, BLOCK_M=bm, SPLIT=512, PORTABLE=True), po),
    "silu": ptx(F._silu_mul_quantize_kernel, silu_t, dict(BLOCK_K=2048, PORTABLE=True), po),
    "dense": ptx(P._dense_kernel, dense_t, dict(BM=8, BN=32, LANES=32), po),
    "exp": ptx(P._exp2_kernel, dict(x_ptr=f32, o_ptr=f32, n="i32"), dict(EXP=True, BLOCK=1024), po),
    # the row kernels the portable engine launches as the fast engine does (fused.OPTIONS)
    "add_rms_norm": ptx(F._add_rms_norm_kernel, rms_t, dict(BLOCK=2048, HAS_D=True, WRITE_H=True, QUANT=True,
                        ROW_MAP=True), dict(fo, num_warps=8)),
    "qk_norm_rope": ptx(F._qk_norm_rope_kernel, rope_t, dict(H=H, KV=KV, D=D, HP=H, KVP=KV), dict(fo, num_warps=8)),
    "quantize": ptx(Q._quantize_rows_kernel, quant_t, dict(BLOCK_K=2048, BF16_BITS=True),
                    {"num_warps": 4, "enable_fp_fusion": False}),
    "control_fast_silu": ptx(F._silu_mul_quantize_kernel, silu_t, dict(BLOCK_K=2048, PORTABLE=False), fo),
}
json.dump(out, sys.stdout)
"""

# One flush-to-zero instruction is allowed: `cvt.rmi.ftz.f32.f32`, the floor of quantize.py's
# _round_half_even (libdevice's floorf under the fused kernels' options). It changes floor(v) only for a
# subnormal v (-1 becomes -0), and the int8 it feeds is 0 either way:
# test_the_flushed_floor_gives_the_same_int8 checks every subnormal.
ALLOWED_FTZ = "cvt.rmi.ftz.f32.f32"
FORBIDDEN = {
    "approximate": r"\.approx\b",
    "flush to zero": r"\.ftz\b",
    "hardware transcendental": r"\b(ex2|lg2|sin|cos|rsqrt|tanh)\.",
    "fp32 fma": r"\bfma\.rn(\.sat)?\.f32\b",
    "tensor-core mma": r"\b(w?gmma|mma)\.",
}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))  # nothing written outside tmp
    res = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr.lower():
        pytest.skip("this Triton has no ptxas to compile for sm_90a")
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _found(text: str) -> dict:
    import re

    text = text.replace(ALLOWED_FTZ, "cvt.rmi.allowed.f32.f32")
    return {what: sorted(set(re.findall(pat, text))) for what, pat in FORBIDDEN.items() if re.search(pat, text)}


def test_the_scan_sees_the_device_exp_of_the_fast_silu(ptx):
    assert "approximate" in _found(ptx["control_fast_silu"])
    assert "flush to zero" in _found("ex2.approx.ftz.f32 %r1, %r2;")
    assert _found(ALLOWED_FTZ + " %r1, %r2;") == {}


def _round_half_even(v: np.ndarray, floor) -> np.ndarray:
    """quantize.py's _round_half_even in float32 numpy, with the given floor."""
    f = floor(v)
    d = (v - f).astype(np.float32)
    half = np.float32(0.5)
    odd = (f - np.float32(2.0) * floor((f * half).astype(np.float32))) != 0
    up = (d > half) | ((d == half) & odd)
    return np.where(up, f + np.float32(1.0), f).astype(np.float32)


def test_the_flushed_floor_gives_the_same_int8():
    """Every fp32 subnormal, both signs: _round_half_even with IEEE floor and with a floor that first
    flushes its input to a signed zero (cvt.rmi.ftz) gives values whose int8 (truncation, as
    Triton's float -> int8 conversion) are equal, all 0. Reference: the two floors side by side."""
    mags = np.arange(1, 1 << 23, dtype=np.uint32)
    v = np.concatenate([mags, mags | np.uint32(1 << 31)]).view(np.float32)
    assert np.all(np.abs(v) < np.finfo(np.float32).tiny)

    def flushed_floor(x):
        x = np.asarray(x, dtype=np.float32)
        tiny = np.abs(x) < np.finfo(np.float32).tiny
        return np.floor(np.where(tiny, np.copysign(np.float32(0.0), x), x)).astype(np.float32)

    ieee = _round_half_even(v, lambda x: np.floor(x).astype(np.float32))
    ftz = _round_half_even(v, flushed_floor)
    assert np.array_equal(np.trunc(ieee).astype(np.int8), np.trunc(ftz).astype(np.int8))
    assert not np.any(np.trunc(ieee).astype(np.int8))


@pytest.mark.parametrize(
    "kernel", ["split", "combine", "silu", "dense", "exp", "add_rms_norm", "qk_norm_rope", "quantize"]
)
def test_portable_kernels_hold_no_machine_dependent_instruction(ptx, kernel):
    assert _found(ptx[kernel]) == {}, kernel
