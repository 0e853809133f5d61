"""Reading the small files of a checkpoint and the reports about it, safely.

config.json, model.safetensors.index.json, SHA256SUMS and the JSON reports are read whole, so
each read here is bounded: only a regular file is read (a FIFO would block forever, a device
such as /dev/zero never end), opened non-blocking so that a FIFO swapped in after the check
cannot hang the open, and at most `limit` bytes (MAX_TEXT_BYTES by default) are read. With
`root`, a link is followed only inside the checkpoint (requant.io.links). JSON nested deeper
than Python's parser can hold (a RecursionError) is refused like any other malformed JSON.
Every refusal is an `error` (a CheckpointError subclass by default) naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from requant.errors import CheckpointError, os_reason
from requant.io.links import check_inside, shown

__all__ = ["MAX_TEXT_BYTES", "read_small", "loads_json", "load_json", "not_regular"]

MAX_TEXT_BYTES = 64 << 20


def not_regular(mode: int) -> str:
    """Why a file of this st_mode is not read (or written) as a regular file."""
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"


def read_small(
    path: str | os.PathLike,
    *,
    what: str = "file",
    root: str | os.PathLike | None = None,
    limit: int = MAX_TEXT_BYTES,
    error: type[CheckpointError] = CheckpointError,
) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see the module docstring)."""
    p = Path(path)
    if root is not None and p.is_symlink():
        check_inside(root, p)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"missing {what}", file=shown(p)) from None
    except IsADirectoryError:
        raise error(f"{what} is a directory, not a file", file=shown(p)) from None
    except OSError as exc:
        raise error(f"cannot read {what}: {os_reason(exc)}", file=shown(p)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {not_regular(st.st_mode)}", file=shown(p))
        if st.st_size > limit:
            raise error(f"{what} is {st.st_size:,} bytes, more than the {limit:,} requant reads", file=shown(p))
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:  # it grew while being read
            raise error(f"{what} is more than the {limit:,} bytes requant reads", file=shown(p))
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"reading {what} failed: {os_reason(exc)}", file=shown(p)) from None
    finally:
        os.close(fd)


def loads_json(data: bytes, *, file, what: str = "file", error: type[CheckpointError] = CheckpointError, **kwargs):
    """json.loads of UTF-8 bytes; malformed, non-UTF-8 or too deeply nested JSON is `error`."""
    try:
        return json.loads(data.decode("utf-8"), **kwargs)
    except UnicodeDecodeError:
        raise error(f"{what} is not UTF-8 text", file=shown(file)) from None
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply", file=shown(file)) from None
    except ValueError as exc:
        raise error(f"{what} is not valid JSON: {exc}", file=shown(file)) from None


def load_json(
    path: str | os.PathLike,
    *,
    what: str = "file",
    root: str | os.PathLike | None = None,
    limit: int = MAX_TEXT_BYTES,
    error: type[CheckpointError] = CheckpointError,
):
    """read_small, then loads_json."""
    return loads_json(
        read_small(path, what=what, root=root, limit=limit, error=error), file=path, what=what, error=error
    )
