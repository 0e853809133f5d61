"""Launching the Triton kernels with little host work per call (eager use).

`kernel[grid](*args, **meta)` (Triton's JITFunction.run) does, on every call: query the
current device and stream, bind and specialize every argument (dtype and 16-byte alignment
of each tensor, == 1 / % 16 / int32 range of each integer, the type string of each tensor
descriptor), build and look up a cache key from that specialization and the options, check
the kernel's globals, and only then launch. In eager use that is tens of microseconds per
call, as long as the GEMM itself at M = 512 (measured: 215 TOPS eager against 636 for a
bare kernel on 512 x 2048 x 6144).

Why the launch key covers Triton's specialization: docs/kernels.md#host-path (tested against
Triton's own binder in tests/kernels/test_triton_launch.py).
"""

import os

import torch

try:  # host-side TMA descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the Triton version
    TensorDescriptor = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_INT32 = (-(2**31), 2**31 - 1)
_UINT64_MAX = 2**64 - 1

# launch key -> CompiledKernel. Bounded by (kernels x configs x argument classes x devices).
_PLANS: dict = {}
# (address, rows, cols, row stride, block rows, block cols) -> TensorDescriptor.
_DESCRIPTORS: dict = {}
_MAX_DESCRIPTORS = 4096

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # what Triton's own launcher uses
    _get_device = torch._C._cuda_getDevice
except AttributeError:  # pragma: no cover - depends on the torch build

    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream

    def _get_device():
        return torch.cuda.current_device()


def device_index(t: torch.Tensor):
    """The CUDA device index of `t`; None for a CPU tensor under TRITON_INTERPRET=1 (the
    interpreter's plain path). Any other tensor is refused with a RuntimeError."""
    if t.is_cuda:
        return t.device.index
    if INTERPRET and t.device.type == "cpu":
        return None
    raise RuntimeError(
        f"the Triton backend needs CUDA tensors (got {t.device}); for CPU tensors set "
        "TRITON_INTERPRET=1 before importing triton (CI does)"
    )


def int_key(v: int) -> int:
    """Triton's specialization class of an integer argument, as one small int."""
    if v == 1:
        return 1
    if _INT32[0] <= v <= _INT32[1]:
        width = 0
    elif v < 2**63:
        width = 4
    elif v <= _UINT64_MAX:
        width = 8
    else:
        raise OverflowError(f"integer argument {v} does not fit in 64 bits")
    return width + (2 if v % 16 == 0 else 0)


def launch_key(kernel_name: str, config: str, index, args, consts: tuple):
    """The launch key of a call: `args` are the kernel's runtime arguments, except that each
    tensor descriptor is replaced by a marker naming it (its int8 dtype and block shape are
    fixed by the config); `consts` the values of its constexpr parameters. Per argument:
    int_key of an integer (inlined for int32), (dtype, data_ptr % 16 == 0) of a tensor."""
    return (
        kernel_name,
        config,
        index,
        consts,
        *[
            ((1 if v == 1 else 0 if v & 15 else 2) if _INT32[0] <= v <= _INT32[1] else int_key(v))
            if type(v) is int
            else (v.dtype, not v.data_ptr() & 15)
            if isinstance(v, torch.Tensor)
            else v
            for v in args
        ],
    )


class _DevicePtr:
    """The base of a cached TensorDescriptor: the address and the dtype, nothing else (no
    reference to the tensor, so a cached descriptor never keeps memory alive)."""

    __slots__ = ("ptr",)
    dtype = torch.int8

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def descriptor(t: torch.Tensor, block) -> "TensorDescriptor":
    """A host TMA descriptor of the 2-D int8 tensor `t` (unit column stride, 16-byte aligned
    base and row stride: the callers check), cached by value."""
    rows, cols = t.shape
    return descriptor_of(t.data_ptr(), rows, cols, t.stride(0), block[0], block[1])


def descriptor_of(ptr: int, rows: int, cols: int, stride: int, block_rows: int, block_cols: int):
    """descriptor() from the tensor's address, shape and row stride."""
    key = (ptr, rows, cols, stride, block_rows, block_cols)
    d = _DESCRIPTORS.get(key)
    if d is None:
        if len(_DESCRIPTORS) >= _MAX_DESCRIPTORS:
            _DESCRIPTORS.clear()
        d = _DESCRIPTORS[key] = TensorDescriptor(_DevicePtr(ptr), [rows, cols], [stride, 1], [block_rows, block_cols])
    return d


def compiled(key):
    """The CompiledKernel a previous call with this launch key used, or None."""
    return _PLANS.get(key) if key is not None else None


def launch(kernel, grid, args, consts, options, key, index, ck=None):
    """Launch `kernel` on `grid` (3 ints) with the runtime arguments `args` (in the kernel's
    order; its constexpr parameters `consts`, a dict in declaration order, follow them) and
    the compile options `options` (num_warps, ...).

    key: the launch key (launch_key), or None for the plain JITFunction path every time.
    ck: compiled(key), when the caller has looked it up already. With a key seen before, the
    CompiledKernel of that key's first call is launched directly.
    """
    if ck is None and key is not None:
        ck = _PLANS.get(key)
    if ck is not None:
        run = ck[grid]
        if index == _get_device():
            run(*args, *consts.values(), stream=_raw_stream(index))
        else:  # the kernel was loaded on that device; launch there, on its current stream
            with torch.cuda.device(index):
                run(*args, *consts.values(), stream=_raw_stream(index))
        return
    if index is None or index == _get_device():
        ck = kernel[grid](*args, **consts, **options)
    else:
        with torch.cuda.device(index):
            ck = kernel[grid](*args, **consts, **options)
    if key is not None and ck is not None and hasattr(ck, "function"):
        _PLANS[key] = ck
