"""Backend pairs for the commands that compare two GEMM kernels, and the environment record.

`parse_backends("cutlass,triton")` -> the pair of names; "reference" -> the two emulations of
the documented epilogue orders (what runs without a GPU). A built-in backend must implement a
known order (requant.kernels.EMULATION_OF): a comparison is only meaningful against a known
formula. Either member may be MODULE:FUNCTION, a kernel with conform's signature
fn(a, w, s_a, s_w) -> bf16 [M, N]: parse_backends only names it; requant.audit.pair.resolve_pair
imports it, gives it its declared order (`--order`, or conform's fingerprint) and returns the
resolved pair. `environment(device)` is the versions-and-device record every report keeps.
"""

from __future__ import annotations

import platform

__all__ = [
    "REFERENCE_PAIR",
    "ORDERS",
    "default_backend",
    "is_custom",
    "parse_backends",
    "check_runnable",
    "environment",
]

REFERENCE_PAIR = ("reference-cutlass-order", "reference-triton-order")


ORDERS = ("cutlass-order", "triton-order", "fused-order")  # the orders with a baseline row (matrix v2)


def default_backend(device: str) -> str:
    """The one scaled_mm backend of the commands that run one model (generate, eval, tp-check):
    triton on CUDA (the fast engine's kernel), its epilogue order emulated on a CPU."""
    return "triton" if str(device).startswith("cuda") else "reference-triton-order"


def is_custom(name: str) -> bool:
    """A MODULE:FUNCTION kernel rather than a built-in backend name."""
    return ":" in name


def parse_backends(spec: str) -> tuple[str, str]:
    """'reference' -> REFERENCE_PAIR; otherwise exactly two backends, each a built-in name
    with a documented epilogue order or a MODULE:FUNCTION kernel (named only: its module is
    imported by requant.audit.pair.resolve_pair). ValueError naming --backends otherwise."""
    from requant import kernels

    spec = spec.strip()
    if spec == "reference":
        return REFERENCE_PAIR
    names = tuple(s.strip() for s in spec.split(",") if s.strip())
    if len(names) != 2:
        raise ValueError(f"--backends takes two comma-separated names or 'reference', got {spec!r}")
    if names[0] == names[1]:  # a kernel compared with itself agrees with itself: a check that cannot fail
        raise ValueError(f"--backends {spec!r} names {names[0]!r} twice: a comparison needs two different backends")
    for n in names:
        if is_custom(n):
            continue
        known = kernels.scaled_mm_backends()
        if n not in known:
            raise ValueError(f"unknown backend {n!r}; known: {', '.join(known)}")
        if n not in kernels.EMULATION_OF:
            raise ValueError(f"backend {n!r} implements no known epilogue order (requant.kernels.EMULATION_OF)")
    return names


def triton_interpreter_on_cpu(device: str, wanted: bool = True) -> bool:
    """On a device that is not CUDA, a Triton kernel runs under Triton's interpreter: set
    TRITON_INTERPRET=1 unless the environment already says (a user's explicit 0 is kept), and
    only while Triton is not yet imported (it reads the variable once, at import). True when
    the interpreter is (now) on."""
    import os
    import sys

    if wanted and not str(device).startswith("cuda") and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_runnable(backends: tuple[str, ...], device: str, act_backend: str, option: str = "--backends") -> None:
    """UsageError naming the option at fault (`option` for the GEMM backends, --act-backend
    for the activation one) when a backend cannot run on `device`, before anything is loaded.
    A triton backend on a CPU device turns Triton's interpreter on (triton_interpreter_on_cpu)."""
    import os

    from requant.errors import UsageError

    triton_interpreter_on_cpu(device, "triton" in backends or act_backend == "triton")

    cpu_hint = "--backends reference" if option == "--backends" else f"{option} reference-triton-order"
    if "cutlass" in backends and not device.startswith("cuda"):
        raise UsageError(f"{option}: the cutlass backend needs a CUDA GPU; on CPU use {cpu_hint}")
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if not device.startswith("cuda") and not interpret:
        if "triton" in backends:
            raise UsageError(
                f"{option}: the triton backend needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU); on CPU use {cpu_hint}"
            )
        if act_backend == "triton":
            raise UsageError(
                "--act-backend triton needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU); on CPU use "
                "--act-backend reference"
            )


def environment(device: str) -> dict:
    """Versions and device name, recorded with every result."""
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if str(device).startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env
