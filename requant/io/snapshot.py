"""The inputs a command read, pinned: a result is only written for the bytes it measured.

Every input file a command reads (a checkpoint's tensors through read_header, every file it
hashes for its manifest digest) is recorded here with the identity of its bytes as they were
first seen: (device, inode, size, mtime_ns). Seen again with other values (hashed, then its
tensors read after a rewrite), or found changed by check() before anything is written
(write_files_atomic, AtomicOutput.commit) or a verdict is printed, the run ends with
InputChanged: exit 2, "CK/model.safetensors changed while it was read; nothing was written".

Why a stat and not a second hash: a second pass over a checkpoint doubles its reading time; an
in-place rewrite moves mtime_ns (and usually the size), a replacement by rename moves the inode,
and the hash itself is taken between two fstats of one descriptor (manifest.file_sha256). Why
one registry per process: a command runs in one process, its hashing threads included;
RequantCommand.invoke clears it when a command starts and checks it when the command ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Callable

from requant.errors import CheckpointError

_lock = threading.Lock()
_seen: dict[str, tuple[tuple[int, ...], str]] = {}
_active = 0  # pins are kept only inside watching() (a command); library calls outside one pin nothing
_published = False  # an output was renamed into place after a check() (published())
# Test hook: called with the path after each input file is pinned (a rewrite between two read phases).
after_pin: Callable[[Path], None] | None = None


class InputChanged(CheckpointError):
    """An input file whose bytes changed while the command read it (exit 2; nothing is written)."""

    def __init__(self, shown: str):
        super().__init__(f"{shown} changed while it was read; nothing was written")


def key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def watching():
    """Pin inputs inside the block (a command's body), starting from none; forgotten after it."""
    global _active, _published
    with _lock:
        if not _active:
            _seen.clear()
            _published = False
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if not _active:
                _seen.clear()


def pin(path: str | os.PathLike, st: os.stat_result | None = None) -> None:
    """Record `path` as read with stat `st` (now, through the path, when None); InputChanged when
    it was pinned before with other values."""
    if not _active:
        return
    p = Path(path)
    real = os.path.realpath(p)
    if st is None:
        st = os.stat(real)
    k = key(st)
    with _lock:
        old = _seen.setdefault(real, (k, str(path)))
    if old[0] != k:
        raise InputChanged(old[1])
    if after_pin is not None:
        after_pin(p)


def published() -> None:
    """An output was renamed into place after check(): what it reports was measured on unchanged
    inputs, so the command's closing check (check_at_end) no longer applies."""
    global _published
    with _lock:
        _published = True


def check_at_end() -> None:
    """check(), for a command that ends without having published an output (its verdict is on stdout)."""
    if not _published:
        check()


def forget() -> None:
    """Forget every pinned input (its bytes were proven another way, e.g. by the Hub's own hashes)."""
    with _lock:
        _seen.clear()


def unpin_under(root: str | os.PathLike) -> None:
    """Forget the pinned inputs under `root` (a temporary checkpoint this run made, read and removed)."""
    prefix = os.path.realpath(root) + os.sep
    with _lock:
        for real in [r for r in _seen if r.startswith(prefix)]:
            del _seen[real]


def check() -> None:
    """InputChanged naming the first pinned input whose path now shows other bytes (or none)."""
    with _lock:
        items = sorted(_seen.items())
    for real, (k, shown) in items:
        try:
            now = key(os.stat(real))
        except OSError:
            raise InputChanged(shown) from None
        if now != k:
            raise InputChanged(shown)


def pinned() -> int:
    with _lock:
        return len(_seen)
