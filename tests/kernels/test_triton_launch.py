"""The cached launch path of the Triton backend (kernels/triton/_launch.py), on the CPU.

A cached launch reuses the CompiledKernel of an earlier call with the same launch key, so the
key must determine Triton's specialization of the call. Reference: Triton's own argument
binder (triton.runtime.jit.create_function_from_signature with the CUDA backend: the code
JITFunction.run calls on every launch), applied to the real kernels' signatures and real
arguments. The bits of cached launches are checked on the GPU (test_gpu.py).
"""

import random
import sys
import weakref

import pytest
import torch

pytest.importorskip("triton")

from requant.kernels.triton import _launch  # noqa: E402
from requant.kernels.triton.quantize import _quantize_rows_kernel  # noqa: E402

sm = sys.modules["requant.kernels.triton.scaled_mm"]

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
    from triton.tools.tensor_descriptor import TensorDescriptor

    _BACKEND = make_backend(GPUTarget("cuda", 90, 32))
except Exception as e:  # noqa: BLE001 - internal API of this Triton version: say why, skip
    _BACKEND = None
    _WHY = f"Triton's binder is not reachable in this version: {type(e).__name__}: {e}"

needs_binder = pytest.mark.skipif(_BACKEND is None, reason="" if _BACKEND is not None else _WHY)

INTS = [1, 2, 15, 16, 17, 32, 4096, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**40 + 3, 2**63 - 16, 2**63, 2**64 - 16]


def _binder(kernel):
    fn = getattr(kernel, "fn", kernel)  # the Python function under the interpreter's wrapper
    while not callable(getattr(fn, "__code__", None)) and hasattr(fn, "fn"):
        fn = fn.fn
    jf = JITFunction(fn)
    return create_function_from_signature(jf.signature, jf.params, _BACKEND)


def _tensor(dtype, aligned, rows=64, cols=128):
    """A 2-D tensor whose data_ptr is 16-byte aligned or not (a view one element in)."""
    base = torch.zeros(rows * cols + 64, dtype=dtype)
    off = 0 if aligned else 1
    assert (base.data_ptr() % 16 == 0) and base.element_size() < 16
    return base[off : off + rows * cols].view(rows, cols)


def _check_key_determines_spec(binder, cases):
    """cases: (args for the key (markers for descriptors), args for the binder, consts)."""
    seen = {}
    specs = set()
    for key_args, real_args, consts in cases:
        key = _launch.launch_key("k", "cfg", 0, key_args, tuple(consts.values()))
        spec = tuple(binder(*real_args, **consts)[1])
        specs.add(spec)
        assert seen.setdefault(key, spec) == spec, f"one launch key, two specializations:\n{seen[key]}\n{spec}"
    return len(seen), len(specs)


@needs_binder
@pytest.mark.parametrize("persistent", [False, True])
def test_tma_kernel_key_determines_specialization(persistent):
    kernel = sm._scaled_mm_persistent_kernel if persistent else sm._scaled_mm_tma_kernel
    binder = _binder(kernel)
    rng = random.Random(1 + persistent)
    a = torch.zeros(64, 128, dtype=torch.int8)
    descs = (TensorDescriptor.from_tensor(a, [64, 128]), TensorDescriptor.from_tensor(a, [128, 128]))
    consts = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8}
    cases = []
    for _ in range(400):
        ptrs = [_tensor(dt, rng.random() < 0.5) for dt in (torch.float32, torch.float32, torch.int16)]
        ints = [rng.choice(INTS) for _ in range(5 if persistent else 4)]
        tail = tuple(ptrs) + tuple(ints)
        cases.append((("a_desc", "w_desc") + tail, descs + tail, consts))
    keys, specs = _check_key_determines_spec(binder, cases)
    assert specs >= 50, f"only {specs} distinct specializations: the cases test too little"


@needs_binder
def test_pointer_kernel_key_determines_specialization():
    binder = _binder(sm._scaled_mm_kernel)
    rng = random.Random(3)
    cases = []
    for _ in range(400):
        ptrs = [
            _tensor(dt, rng.random() < 0.5)
            for dt in (torch.int8, torch.int8, torch.float32, torch.float32, torch.int16)
        ]
        ints = [rng.choice(INTS) for _ in range(6)]
        consts = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "EVEN_K": rng.random() < 0.5}
        args = tuple(ptrs) + tuple(ints)
        cases.append((args, args, consts))
    keys, specs = _check_key_determines_spec(binder, cases)
    assert specs >= 100


@needs_binder
def test_quantize_kernel_key_determines_specialization():
    binder = _binder(_quantize_rows_kernel)
    rng = random.Random(4)
    cases = []
    for _ in range(300):
        x = _tensor(rng.choice([torch.int16, torch.float16, torch.float32]), rng.random() < 0.5)
        q = _tensor(torch.int8, rng.random() < 0.5)
        s = _tensor(torch.float32, rng.random() < 0.5)
        args = (x, q, s) + tuple(rng.choice(INTS) for _ in range(3))
        consts = {"BLOCK_K": 1024, "BF16_BITS": x.dtype == torch.int16}
        cases.append((args, args, consts))
    keys, specs = _check_key_determines_spec(binder, cases)
    assert specs >= 50


def test_int_key_classes():
    """reference: Triton's rule as documented in _launch (== 1; % 16; int32/int64/uint64)."""
    assert _launch.int_key(1) == 1
    assert _launch.int_key(16) != _launch.int_key(17) != _launch.int_key(1)
    assert _launch.int_key(2**31 - 1) != _launch.int_key(2**31 - 1 + 2**31)  # i32 vs i64
    assert _launch.int_key(2**31 + 16) != _launch.int_key(16)
    assert _launch.int_key(2**63) != _launch.int_key(2**63 - 16)  # u64 vs i64 (both % 16 == 0)
    with pytest.raises(OverflowError):
        _launch.int_key(2**64)


def test_cached_descriptor_matches_from_tensor_and_holds_no_tensor():
    """reference: TensorDescriptor.from_tensor on the same tensor (every field but the base,
    whose address must be the tensor's)."""
    pytest.importorskip("triton.tools.tensor_descriptor")
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    t = torch.zeros(48, 4096, dtype=torch.int8)[:, :2048]  # row stride 4096, 2048 columns
    d = _launch.descriptor(t, [64, 128])
    want = TD.from_tensor(t, [64, 128])
    assert d.base.data_ptr() == t.data_ptr() and d.base.dtype == torch.int8
    assert list(d.shape) == list(want.shape) and list(d.strides) == list(want.strides)
    assert list(d.block_shape) == list(want.block_shape) and d.padding == want.padding
    assert _launch.descriptor(t, [64, 128]) is d  # cached by value
    assert _launch.descriptor(t, [128, 128]) is not d
    ref = weakref.ref(t)
    del t, want  # from_tensor's descriptor does hold the tensor; the cached one must not
    assert ref() is None, "a cached descriptor keeps its tensor alive"


class _FakeCompiled:
    """Stands for Triton's CompiledKernel: `ck[grid](*params, stream=s)` records the launch."""

    function = object()

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def runner(*params, stream=None):
            self.launches.append((grid, params, stream))

        return runner


class _FakeJIT:
    """Stands for a JITFunction: `k[grid](*args, **kw)` records the call, returns the kernel."""

    def __init__(self):
        self.calls = []
        self.compiled = _FakeCompiled()

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.calls.append((grid, args, kw))
            return self.compiled

        return run


def test_launch_reuses_the_compiled_kernel(monkeypatch):
    """reference: Triton's calling convention, JITFunction.run ending in
    kernel.run(grid..., *bound_args.values()): every parameter, constexprs included, in
    declaration order, on the current stream."""
    monkeypatch.setattr(_launch, "_get_device", lambda: 0)
    monkeypatch.setattr(_launch, "_raw_stream", lambda index: 1000 + index)
    monkeypatch.setattr(_launch, "_PLANS", {})
    k = _FakeJIT()
    consts = {"BLOCK": 64, "EVEN": True}
    opts = {"num_warps": 4, "enable_fp_fusion": False}
    key = _launch.launch_key("k", "cfg", 0, (7, 16), tuple(consts.values()))
    _launch.launch(k, (3, 1, 1), (7, 16), consts, opts, key, 0)
    assert k.calls == [((3, 1, 1), (7, 16), {"BLOCK": 64, "EVEN": True, "num_warps": 4, "enable_fp_fusion": False})]
    assert _launch.compiled(key) is k.compiled
    _launch.launch(k, (5, 1, 1), (9, 32), consts, opts, key, 0)
    assert len(k.calls) == 1, "a second call with the same key went through JITFunction again"
    assert k.compiled.launches == [((5, 1, 1), (9, 32, 64, True), 1000)]
    _launch.launch(k, (5, 1, 1), (9, 32), consts, opts, None, 0)  # no key: the plain path
    assert len(k.calls) == 2 and len(k.compiled.launches) == 1
    other = _launch.launch_key("k", "cfg", 0, (7, 17), tuple(consts.values()))  # 17: another specialization
    assert other != key and _launch.compiled(other) is None
