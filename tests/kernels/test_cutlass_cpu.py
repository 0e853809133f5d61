"""The CUTLASS backend where no sm90 GPU is: clear errors, never a silent fallback.
Reference: none (error behaviour only)."""

import pytest
import torch

from requant import kernels

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")


def test_cutlass_refuses_without_gpu():
    a = torch.zeros(2, 16, dtype=torch.int8)
    w = torch.zeros(8, 16, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="sm90"):
        kernels.scaled_mm(a, w, torch.ones(2, 1), torch.ones(8, 1), backend="cutlass")


def test_cutlass_build_refuses_without_gpu():
    from requant.kernels import cutlass

    with pytest.raises(RuntimeError, match="sm90"):
        cutlass.build()


def test_cutlass_sources_ship():
    import os

    from requant.kernels import cutlass

    for src in cutlass.SOURCES + cutlass.HEADERS:
        assert os.path.isfile(os.path.join(os.path.dirname(cutlass.__file__), src)), src


def test_stale_build_lock_is_named_not_waited_on(tmp_path):
    """reference: none (error behaviour). torch's FileBaton would wait forever on a lock
    left by a killed build; build() checks its age first."""
    import os
    import time

    from requant.kernels import cutlass

    cutlass.check_stale_lock(str(tmp_path))  # no lock: fine
    lock = tmp_path / "lock"
    lock.write_text("")
    cutlass.check_stale_lock(str(tmp_path))  # fresh: another build may be running
    old = time.time() - cutlass.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.raises(RuntimeError, match="stale build lock"):
        cutlass.check_stale_lock(str(tmp_path))
    assert lock.exists()  # reported, never removed behind the user's back
