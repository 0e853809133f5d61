"""CUTLASS backend: an sm90a W8A8 GEMM with the CUTLASS epilogue order, built just in time.

    y = bf16_rne( s_a * fp32( s_w * fp32(acc) ) ),   acc = a @ w^T exact in int32

The kernel (w8a8_sm90.cuh) comes from the CUTLASS 3.x collective builders: a TMA
warp-specialized mainloop (Pingpong; one Cooperative tile is built as a measured
alternative, see w8a8_sm90_select.h) and an
epilogue visitor tree (column broadcast of s_a, row broadcast of s_w, two separately
rounded fp32 multiplies in the order above, round to nearest even to bf16). It equals
kernels.reference.scaled_mm_cutlass_order bit for bit; tile and scheduler swizzle (chosen
by shape in w8a8_sm90_select.h) never change a bit because int32 accumulation is exact.

Shapes (padding is exact) and the build: docs/kernels.md#numerics, docs/kernels.md#cutlass-build.
"""

import os
import threading
import time

import torch

from requant.kernels.reference import check_operands, epilogue_cutlass_order

_HERE = os.path.dirname(os.path.abspath(__file__))
_TILES = ("decode", "small", "medium", "large", "mid")
SOURCES = ["binding.cpp", "w8a8_sm90.cu"] + [f"w8a8_sm90_tile_{t}.cu" for t in _TILES]
HEADERS = ["w8a8_sm90.cuh", "w8a8_sm90.h", "w8a8_sm90_select.h"]
# Tile names by index (the `tile` argument); the default choice by shape, and the default
# scheduler swizzle, are in w8a8_sm90_select.h.
TILES = dict(enumerate(_TILES))
# `swizzle=None` lets w8a8_sm90_default_swizzle choose (1, or 8 for very large operands).
SWIZZLE = None

_ext = None
_lock = threading.Lock()
# A build takes ~70 s with 16 jobs; a lock this old belongs to a build that died.
STALE_LOCK_S = 30 * 60


def cutlass_include_dirs() -> list[str]:
    try:
        import cutlass_library
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("the CUTLASS backend needs the `nvidia-cutlass` wheel (pip install nvidia-cutlass)") from e
    root = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
    dirs = [os.path.join(root, "include"), os.path.join(root, "tools", "util", "include")]
    for d in dirs:
        if not os.path.isdir(d):
            raise RuntimeError(f"nvidia-cutlass is installed but has no {d}")
    return dirs


def _require_sm90() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("the CUTLASS backend needs an sm90 (Hopper) GPU; no CUDA device is available")
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        raise RuntimeError(f"the CUTLASS backend is built for sm90a (H100/H200); this GPU is sm{cap[0]}{cap[1]}")


def stage_sources(cache: str) -> str:
    """Copy SOURCES and HEADERS into `cache`/src, rewriting a copy only when its bytes differ; returns
    that folder. ninja rebuilds what is older than its inputs: a fresh copy of this checkout (a GPU
    machine gets one per call) gave every source a new mtime and rebuilt all seven units (50-60 s)
    though nothing had changed. The staged copies keep their mtimes while their bytes stay the same."""
    src = os.path.join(cache, "src")
    os.makedirs(src, exist_ok=True)
    for name in SOURCES + HEADERS:
        with open(os.path.join(_HERE, name), "rb") as f:
            data = f.read()
        dst = os.path.join(src, name)
        try:
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        except FileNotFoundError:
            pass
        tmp = f"{dst}.{os.getpid()}.{threading.get_ident()}.tmp"  # concurrent builders each write their own
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)
    return src


def load_kwargs(verbose: bool = False) -> dict:
    """Arguments of torch.utils.cpp_extension.load for this extension (no GPU needed); the sources
    are the copies stage_sources keeps in the cache."""
    cache = os.environ.get(
        "REQUANT_CUTLASS_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "requant", "cutlass")
    )
    os.makedirs(cache, exist_ok=True)
    src = stage_sources(cache)
    cuda_flags = [
        # wgmma and TMA need the arch-specific target; naming it also stops torch from
        # adding its own -gencode flags (which would compile everything twice).
        "-gencode=arch=compute_90a,code=sm_90a",
        "-DNDEBUG",
        "-O3",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        # torch defines these to hide implicit half/bf16 conversions; CUTLASS needs them.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__",
        "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    ]
    return dict(
        name="requant_w8a8_sm90",
        sources=[os.path.join(src, s) for s in SOURCES],
        extra_include_paths=cutlass_include_dirs() + [src],
        extra_cflags=["-O3", "-DNDEBUG"],
        extra_cuda_cflags=cuda_flags,
        build_directory=cache,
        verbose=verbose,
    )


def check_stale_lock(build_directory: str, max_age_s: float = STALE_LOCK_S) -> None:
    """Raise RuntimeError if torch's build lock in `build_directory` is older than
    max_age_s: torch.utils.cpp_extension.load would wait on it forever. A younger lock
    is left alone (another process may be building; load waits for it)."""
    lock = os.path.join(build_directory, "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:  # no lock (the usual case), or it vanished meanwhile
        return
    if age > max_age_s:
        raise RuntimeError(
            f"stale build lock {lock} ({age / 60:.0f} min old): a killed build leaves it behind and "
            f"every later build would hang on it; remove it if no build is running (rm -f {lock})"
        )


def build(verbose: bool = False):
    """Compile (or load from the cache) the extension; returns the module.

    Raises RuntimeError without an sm90 GPU, and on a stale build lock (see
    check_stale_lock) instead of hanging on it.
    """
    global _ext
    with _lock:
        if _ext is None:
            _require_sm90()
            from torch.utils.cpp_extension import load

            kwargs = load_kwargs(verbose)
            check_stale_lock(kwargs["build_directory"])
            _ext = load(**kwargs)
        return _ext


def _aligned(t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)  # one copy into a fresh (aligned) block


def scaled_mm(
    a: torch.Tensor,
    w: torch.Tensor,
    s_a: torch.Tensor,
    s_w: torch.Tensor,
    tile: int | None = None,
    swizzle: int | None = SWIZZLE,
) -> torch.Tensor:
    """a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1], s_w fp32 [N, 1] -> bf16 [M, N].

    `tile` (an index of TILES) overrides the shape-based choice and `swizzle` the tile
    scheduler's swizzle (1, 2, 4, 8; None: the default of w8a8_sm90_select.h); neither
    changes a bit (exact int32 accumulation).
    """
    check_operands(a, w, s_a, s_w)
    if not a.is_cuda:
        raise RuntimeError(f"the CUTLASS backend needs CUDA tensors on an sm90 GPU, got {a.device}")
    m, k = a.shape
    n = w.shape[0]
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if k == 0:
        return epilogue_cutlass_order(torch.zeros((m, n), dtype=torch.int32, device=a.device), s_a, s_w)
    ext = _ext if _ext is not None else build()
    pad_k = -k % 16
    pad_n = -n % 8
    if pad_k:  # zero columns add nothing to the exact int32 sum
        a = torch.nn.functional.pad(a, (0, pad_k))
        w = torch.nn.functional.pad(w, (0, pad_k))
    if pad_n:  # zero rows of w with zero scales; their outputs are sliced off
        w = torch.nn.functional.pad(w, (0, 0, 0, pad_n))
        s_w = torch.nn.functional.pad(s_w, (0, 0, 0, pad_n))
    # The binding sets the operands' device itself (CUDAGuard): no Python device context.
    out = ext.scaled_mm(
        _aligned(a),
        _aligned(w),
        s_a.contiguous(),
        s_w.contiguous(),
        -1 if tile is None else int(tile),
        -1 if swizzle is None else int(swizzle),
    )
    return out[:, :n].contiguous() if pad_n else out
