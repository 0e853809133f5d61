"""Host (Python) time per eager call of the Triton W8A8 path, as of commit 7b4df52 (before the
host-overhead work) and now, measured on the CPU with the GPU launch stubbed (no GPU needed).

    python3 benchmarks/bench_host.py [--out DIR] [--number 20000]

What is timed, per call, on CPU tensors of the real shapes (Triton's real argument binder is
used, with the CUDA backend, so specialization costs are the GPU path's):
  before  requant.kernels.scaled_mm(backend="triton") as of commit 7b4df52: importlib
          resolution, the operand check, config_for (triton.cdiv), two
          TensorDescriptor.from_tensor, then what JITFunction.run does before the launch:
          bind + specialize every argument, build and look up the cache key.
  after   the same call now: cached resolution, the leaner check, cached config_for, the
          launch key, descriptors cached by value, and the CompiledKernel's launch entry.
Not timed (the same before and after, or GPU-only): Triton's launcher (scratch allocation,
tensor-descriptor encoding, cuLaunchKernel; a few microseconds), the device and stream
queries, and the old path's torch.cuda.device context (a device switch and back, ~2 us).
The quantization's per-call check was a device synchronization before (bool(isfinite.all())
on a GPU tensor); that cost is the GPU's queue, not host time, and is measured by
bench_speed.py on the GPU.
The output allocation (torch.empty; a malloc on the CPU, the caching allocator on a GPU) is
timed apart and subtracted from both. Writes host_overhead.json and prints a table.
"""

import argparse
import importlib
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # real JITFunctions (never launched here)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _qwen3_shapes import QWEN3  # noqa: E402
from _timing import host_us  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

import requant.kernels as K  # noqa: E402
from requant.io.output import write_json_atomic  # noqa: E402
from requant.kernels.triton import _launch  # noqa: E402

BEFORE = "7b4df52"  # the last commit before the host-overhead work
BACKEND = make_backend(GPUTarget("cuda", 90, 32))


def _shape(model: str, linear: str, m: int, note: str = "") -> tuple[str, int, int, int]:
    (n, k) = next((n, k) for name, n, k, _ in QWEN3[model] if name == linear)
    return (f"{model} {linear}, M={m}{note}", m, n, k)


SHAPES = [
    _shape("Qwen3-1.7B", "gate,up", 512, " (the first measured 512 x 2048 x 6144)"),
    _shape("Qwen3-8B", "q,o", 16, " (decode, pointer kernel)"),
    _shape("Qwen3-8B", "k,v", 128),
]


class _JitBookkeeping:
    """Stands for a JITFunction: `k[grid](*args, **kw)` does JITFunction.run's work before the
    launch (bind and specialize the arguments, the cache key) and launches nothing."""

    def __init__(self, jit):
        self.binder = create_function_from_signature(jit.signature, jit.params, BACKEND)
        self.cache = {}

    def __getitem__(self, grid):
        def run(*args, **kw):
            kw["debug"] = False
            kw["instrumentation_mode"] = ""
            _, spec, options = self.binder(*args, **kw)
            compute_cache_key(self.cache, spec, options)

        return run


class _CompiledStub:
    """Stands for a CompiledKernel: `ck[grid](*params, stream=s)` launches nothing."""

    function = object()

    def __getitem__(self, grid):
        return lambda *params, stream=None: None


class _AllPlans(dict):
    def get(self, key, default=None):
        return _STUB


_STUB = _CompiledStub()


def _load_old(rel, name):
    """A module of the tree as of BEFORE, imported under another name."""
    src = subprocess.run(["git", "show", f"{BEFORE}:{rel}"], capture_output=True, text=True, check=True).stdout
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _old_path():
    old_ref = _load_old("kernels/reference.py", "_old_reference")
    old_sm = _load_old("kernels/triton/scaled_mm.py", "_old_scaled_mm")
    old_sm.check_operands = old_ref.check_operands
    for name in ("_scaled_mm_tma_kernel", "_scaled_mm_persistent_kernel", "_scaled_mm_kernel"):
        setattr(old_sm, name, _JitBookkeeping(getattr(old_sm, name)))
    sys.modules["_old_triton_pkg"] = type(sys)("_old_triton_pkg")
    sys.modules["_old_triton_pkg"].scaled_mm = old_sm.scaled_mm

    def call(a, w, s_a, s_w):
        # kernels/__init__.py then kernels/triton/__init__.py as of BEFORE (device context omitted)
        fn = importlib.import_module("_old_triton_pkg").scaled_mm
        if not (a.device.type == "cuda" or a.device.type == "cpu"):
            raise RuntimeError
        return fn(a, w, s_a, s_w)

    return call


def _new_path():
    def as_gpu0(t):  # as if on GPU 0 (the same attribute reads): the cached path, stub launches
        return 0 if (t.is_cuda or t.device.index is None) else 0

    _launch.device_index = as_gpu0
    _launch._get_device = lambda: 0
    _launch._raw_stream = lambda index: 0
    _launch._PLANS = _AllPlans()
    _launch.INTERPRET = False  # device_index is stubbed; keep the compiled path on

    def call(a, w, s_a, s_w):
        return K.scaled_mm(a, w, s_a, s_w, backend="triton")

    return call


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--number", type=int, default=20000)
    args = p.parse_args()
    old, new = _old_path(), _new_path()
    rows = []
    for label, m, n, k in SHAPES:
        a = torch.zeros(m, k, dtype=torch.int8)
        w = torch.zeros(n, k, dtype=torch.int8)
        s_a, s_w = torch.ones(m, 1), torch.ones(n, 1)
        old(a, w, s_a, s_w), new(a, w, s_a, s_w)
        t_old = host_us(lambda: old(a, w, s_a, s_w), args.number)
        t_new = host_us(lambda: new(a, w, s_a, s_w), args.number)
        # The output allocation is in both paths; on the CPU it is a malloc (tens of us for large
        # outputs), on a GPU the caching allocator's few us. Reported apart, and subtracted.
        t_out = host_us(lambda: torch.empty((m, n), dtype=torch.bfloat16), args.number)
        rows.append(
            {"shape": label, "m": m, "n": n, "k": k, "before_us": t_old, "after_us": t_new, "output_alloc_us": t_out}
        )
        print(
            f"{label:58s} before {t_old - t_out:6.1f} us  after {t_new - t_out:6.1f} us  (+ {t_out:4.1f} us CPU output "
            f"allocation in both)  saved {t_old - t_new:6.1f} us",
            flush=True,
        )
    res = {
        "command": "python3 benchmarks/bench_host.py " + " ".join(sys.argv[1:]),
        "before_commit": BEFORE,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "rows": rows,
        "note": __doc__,
    }
    write_json_atomic(os.path.join(args.out, "host_overhead.json"), res)


if __name__ == "__main__":
    main()
