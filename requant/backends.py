"""Backend pairs for the commands that compare two GEMM kernels, and the environment record.

`parse_backends("cutlass,triton")` -> the pair; "reference" -> the two emulations of the
documented epilogue orders (what runs without a GPU). A registered backend must declare the
order it implements (requant.kernels.EMULATION_OF): a comparison is only meaningful against
a known formula. Either member may be MODULE:FUNCTION, a kernel with conform's signature
fn(a, w, s_a, s_w) -> bf16 [M, N] (requant.audit.conform.resolve_kernel): it is registered
under that name (kernels.register_scaled_mm), wrapped so that every call is checked
(requant.user_kernel.guarded). Its declared order (the audit's C8 and baseline
row need one) comes from declare_orders: `--order NAME`, or conform's fingerprint on the
crafted vectors. `environment(device)` is the versions-and-device record every report keeps.
"""

from __future__ import annotations

import platform

__all__ = [
    "REFERENCE_PAIR",
    "ORDERS",
    "default_backend",
    "is_custom",
    "parse_backends",
    "declare_orders",
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
    """A MODULE:FUNCTION kernel rather than a registered backend name."""
    return ":" in name


def _register_custom(name: str) -> None:
    from requant import kernels
    from requant.audit.conform import resolve_kernel
    from requant.user_kernel import guarded

    if name in kernels.scaled_mm_backends():
        return
    try:
        _, fn = resolve_kernel(None, name)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--kernel", "--backends", 1)) from None
    kernels.register_scaled_mm(name, guarded(name, fn))  # every call checked: requant.user_kernel


def parse_backends(spec: str) -> tuple[str, str]:
    """'reference' -> REFERENCE_PAIR; otherwise exactly two backends, each a registered name
    with a documented epilogue order or a MODULE:FUNCTION kernel (imported and registered
    here, without an order: declare_orders gives it one). ValueError naming --backends otherwise."""
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
            _register_custom(n)
            continue
        known = kernels.scaled_mm_backends()
        if n not in known:
            raise ValueError(f"unknown backend {n!r}; known: {', '.join(known)}")
        if n not in kernels.EMULATION_OF:
            raise ValueError(f"backend {n!r} implements no known epilogue order (requant.kernels.EMULATION_OF)")
    return names


def declare_orders(pair: tuple[str, ...], order: str | None, device: str, vectors=None, require: bool = True) -> dict:
    """The epilogue order each MODULE:FUNCTION member of `pair` declares, registered with it
    (kernels.EMULATION_OF). order: one name of ORDERS for every custom member, or a
    comma-separated list, one per custom member in pair order; None: conform's fingerprint
    (requant.audit.conform, the identification cases of the crafted vectors) names the
    formula the kernel implements, which must be one of ORDERS. Returns {name: {order,
    source, verdict}} (the JSON's custom_kernels). ValueError naming --order otherwise.
    require=False (determinism, which needs no order): a kernel that runs every case but
    implements no declarable order is registered without one (order None)."""
    from requant import kernels

    custom = [n for n in dict.fromkeys(pair) if is_custom(n)]
    if order is not None and not custom:
        raise ValueError("--order applies to MODULE:FUNCTION members of --backends only")
    given = [o.strip() for o in order.split(",")] if order is not None else []
    if given and len(given) not in (1, len(custom)):
        raise ValueError(f"--order takes one order or one per MODULE:FUNCTION member ({len(custom)}), got {order!r}")
    out = {}
    for i, name in enumerate(custom):
        if given:
            o = given[0] if len(given) == 1 else given[i]
            if o not in ORDERS:
                raise ValueError(f"--order {o!r}: known orders are {', '.join(ORDERS)}")
            rec = {"order": o, "source": "--order", "verdict": None}
        else:
            rec = _fingerprint_order(name, device, vectors, require)
        kernels.register_scaled_mm(name, kernels._RESOLVED[("scaled_mm", name)], order=rec["order"])
        out[name] = rec
    return out


def _fingerprint_order(name: str, device: str, vectors, require: bool = True) -> dict:
    from requant import kernels
    from requant.audit.conform import KernelError, fingerprint, run_cases
    from requant.audit.conform import vectors as V

    vs = vectors if vectors is not None else V.build_vectors(batch_ms=())
    ident = {c.name for c in vs.cases if c.kind in ("epilogue", "accumulator")}
    fn = kernels._RESOLVED[("scaled_mm", name)]
    fn = getattr(fn, "user_fn", fn)  # run_cases checks each case itself and names it
    try:
        rep = fingerprint(name, run_cases(name, fn, vs, device, cases=ident), vs)
    except KernelError as exc:
        raise ValueError(f"--backends {name}: {exc}") from None
    if not rep["identified"] or len(rep["formulas_agreeing"]) != 1 or rep["formula"] not in ORDERS:
        if not require:
            return {"order": None, "source": "fingerprint", "verdict": rep["verdict"]}
        raise ValueError(
            f"--backends {name}: conform's fingerprint names no declarable order ({rep['verdict']}); "
            f"give --order ({', '.join(ORDERS)})"
        )
    return {"order": rep["formula"], "source": "fingerprint", "verdict": rep["verdict"]}


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
