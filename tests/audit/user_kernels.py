"""Adversarial scaled_mm kernels for `--backends A,MODULE:FUNCTION` and `conform --kernel` tests.

Each is the Triton order (tests/audit/custom_kernels.triton_order, written from the
definitions) on its first GOOD_CALLS calls, so that conform's fingerprint (and the audit's first
Linears) see a legal kernel, and then misbehaves: a later call is where the run must not
pass. GOOD_CALLS counts the calls of this process (a command's child process starts at zero);
the fingerprint uses the identification cases (fewer than 40 calls), the embedded default's
prefill 28 Linears per prompt.
"""

import os
import signal
import sys
import time

import torch

from tests.audit.custom_kernels import triton_order

GOOD_CALLS = 60
_calls = {"n": 0}


def _later() -> bool:
    _calls["n"] += 1
    return _calls["n"] > GOOD_CALLS


def _bad_after(bad):
    def kernel(a, w, s_a, s_w):
        if _later():
            return bad(a, w, s_a, s_w)
        return triton_order(a, w, s_a, s_w)

    return kernel


def _raise(*_):
    raise RuntimeError("kernel tile failed")


def _exit0(*_):
    sys.exit(0)


def _os_exit0(*_):
    sys.stdout.flush()
    os._exit(0)


def _interrupt(*_):
    raise KeyboardInterrupt


class Sub(torch.Tensor):
    pass


exits_later = _bad_after(_exit0)
os_exits_later = _bad_after(_os_exit0)
raises_later = _bad_after(_raise)
interrupts_later = _bad_after(_interrupt)
float32_later = _bad_after(lambda a, w, s_a, s_w: triton_order(a, w, s_a, s_w).float())
shape_later = _bad_after(lambda a, w, s_a, s_w: triton_order(a, w, s_a, s_w)[:, :-1])
meta_later = _bad_after(lambda a, w, s_a, s_w: torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16, device="meta"))
none_later = _bad_after(lambda a, w, s_a, s_w: None)
list_later = _bad_after(lambda a, w, s_a, s_w: triton_order(a, w, s_a, s_w).tolist())
subclass_later = _bad_after(lambda a, w, s_a, s_w: triton_order(a, w, s_a, s_w).as_subclass(Sub))
sparse_later = _bad_after(lambda a, w, s_a, s_w: triton_order(a, w, s_a, s_w).to_sparse())


def always_raises(a, w, s_a, s_w):
    raise ValueError("not implemented")


def os_exits_at_once(a, w, s_a, s_w):
    sys.stdout.flush()
    os._exit(0)


def _sleep(*_):
    marker = os.environ.get("REQUANT_TEST_MARKER")
    if marker:  # tell the test this process is inside the kernel, and which process it is
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(600)


sleeps_later = _bad_after(_sleep)


def _deaf_sleep(*ops):
    """A kernel stuck where no signal reaches (as in a C call): SIGINT and SIGTERM ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _sleep(*ops)


sleeps_deaf_later = _bad_after(_deaf_sleep)
