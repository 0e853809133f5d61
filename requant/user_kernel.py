"""The one place a user's MODULE:FUNCTION scaled_mm kernel is called from.

`guarded(name, fn)` is what `--backends A,MODULE:FUNCTION` registers in place of the user's
function (requant.backends), and `check_output` is what conform's fingerprint applies to each
case (requant.audit.conform): every call, whichever command makes it, is checked the same way.
A call that raises (any exception, SystemExit included), or returns anything but a plain dense
bf16 tensor of shape [M, N] on the operands' device (None, a list, a meta, sparse or nested
tensor, a tensor subclass, another dtype or shape) becomes a `KernelError` naming the kernel and
the call: a refused request (exit 2), never a verdict. KeyboardInterrupt passes through (an
interrupt is 130, not a kernel fault). What a Python wrapper cannot catch (os._exit, a C-level
exit or crash) is handled by running such commands in a child process
(requant.commands._isolate; docs/audit.md, "Your own kernel").
"""

from __future__ import annotations

__all__ = ["KernelError", "guarded", "check_output", "message"]


class KernelError(ValueError):
    """A user kernel that could not be run as a scaled_mm (refused request: exit 2)."""


def message(exc: BaseException) -> str:
    """The first line of an exception's message; one whose __str__ itself fails says so."""
    try:
        text = str(exc).strip()
    except Exception as inner:
        return f"(its message could not be rendered: {type(inner).__name__})"
    return text.splitlines()[0] if text else ""


def check_output(name: str, y, m: int, n: int, where: str, device=None):
    """`y` when it is a plain dense bf16 [m, n] tensor (on `device` when given); KernelError
    naming the kernel and `where` (the call or the case) otherwise."""
    import torch

    if not isinstance(y, torch.Tensor):
        raise KernelError(f"kernel {name} returned {type(y).__name__} on {where}, not a tensor")
    if type(y) is not torch.Tensor:
        raise KernelError(f"kernel {name} returned a {type(y).__name__} (a tensor subclass) on {where}, not a tensor")
    if y.is_nested or y.layout != torch.strided or y.device.type == "meta":
        what = "a nested" if y.is_nested else "a meta" if y.device.type == "meta" else f"a {y.layout}"
        raise KernelError(f"kernel {name} returned {what} tensor on {where}, not a dense strided one")
    if y.dtype != torch.bfloat16:
        raise KernelError(f"kernel {name} returned dtype {y.dtype} on {where}, expected torch.bfloat16")
    if tuple(y.shape) != (m, n):
        raise KernelError(f"kernel {name} returned shape {tuple(y.shape)} on {where}, expected ({m}, {n})")
    if device is not None and y.device != device:
        raise KernelError(f"kernel {name} returned a tensor on {y.device} on {where}, expected {device}")
    return y


def call(name: str, fn, args: tuple, where: str):
    """fn(*args) with every failure a KernelError naming `name` and `where`."""
    try:
        return fn(*args)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the command's 130, not a kernel fault
        raise
    except SystemExit as exc:  # never a verdict: exit 0 here would read as a pass
        raise KernelError(f"kernel {name} called sys.exit({exc.code!r}) on {where}") from None
    except BaseException as exc:  # any other failure of user code is a refused request
        raise KernelError(f"kernel {name} raised {type(exc).__name__} on {where}: {message(exc)}") from None


def guarded(name: str, fn):
    """fn wrapped so that every call is checked (module docstring); the wrapper keeps the
    user's function as `.user_fn` (conform's fingerprint calls it through run_cases, which
    checks each case the same way and names the case)."""
    calls = 0

    def kernel(a, w, s_a, s_w):
        nonlocal calls
        calls += 1
        where = f"call {calls} (a {list(a.shape)}, w {list(w.shape)})"
        ops = tuple(t.clone() for t in (a, w, s_a, s_w))  # copies: the kernel may not change the model's operands
        y = call(name, fn, ops, where)
        return check_output(name, y, a.shape[0], w.shape[0], where, a.device)

    kernel.user_fn = fn
    kernel.__qualname__ = kernel.__name__ = "guarded_user_kernel"
    return kernel
