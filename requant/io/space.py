"""Free space: a full filesystem named in the error line, and convert refused before it starts
when the output cannot fit (needed vs free, one line)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from requant.errors import OutputError

FULL = (errno.ENOSPC, errno.EDQUOT)


def mount_of(path: str | os.PathLike) -> Path:
    """The mount point of the filesystem holding `path` (its nearest existing ancestor)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    dev = p.stat().st_dev
    while p != p.parent and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on `path`'s filesystem (statvfs f_bavail)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def where_full(path: str | os.PathLike) -> str:
    """' on the filesystem mounted at M (F bytes free)' for an error line ('' when it cannot be told)."""
    try:
        return f" on the filesystem mounted at {mount_of(path)} ({free_bytes(path):,} bytes free)"
    except OSError:
        return ""


def full_reason(exc: OSError, path: str | os.PathLike, reason: str) -> str:
    """`reason`, with the filesystem and the next step when exc is a full disk or quota."""
    if exc.errno not in FULL:
        return reason
    return f"{reason}{where_full(path)}: free space there or write the output elsewhere"


def check_room(out: str | os.PathLike, needed: int, shown: str) -> None:
    """OutputError before any work when `needed` bytes cannot fit beside OUT."""
    try:
        free = free_bytes(Path(out).absolute().parent)
        mount = mount_of(Path(out).absolute().parent)
    except OSError:
        return  # cannot be told: the writes will name a full filesystem if it is
    if needed > free:
        raise OutputError(
            f"needs {needed:,} bytes but the filesystem mounted at {mount} has {free:,} free; "
            "free space there or choose an output on another filesystem",
            file=shown,
        )
