"""Atomic output: a checkpoint directory appears complete and durable, or not at all.

  * Everything is written into a temporary directory in OUT's own parent directory
    (`.OUT.requant-tmp-*`; OUT's last component is not resolved, so a symlinked OUT is
    replaced as a link, never followed, and no rename crosses a device) that is renamed to
    OUT at the end.
  * Every output file and directory is fsynced before the rename, the parent directory
    after it (and any directories made for OUT), so a crash leaves either the old state or
    the complete new output.
  * On any error or interrupt the temporary directory is removed, directories made for OUT
    are removed again, and nothing named OUT appears.
  * OUT inside SRC (or SRC inside OUT) is refused. An existing OUT is only replaced with
    force=True, checked again just before the rename (an OUT that appeared meanwhile is an
    error); the old OUT is moved aside first and put back if the rename fails.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from requant.errors import OutputError
from requant.safetensors_io import os_reason


def check_output(src: Path, out: Path, force: bool) -> None:
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise OutputError(f"output would be inside the source checkpoint {s}; requant never writes there", file=out)
    if o in s.parents:
        raise OutputError(f"output contains the source checkpoint {s}; replacing it would destroy the source", file=out)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputError("already exists; pass --force to replace it", file=out)


def output_path(output: str | os.PathLike) -> Path:
    """OUT as an absolute path whose parent is resolved but whose last component is not:
    the temporary directory, the moved-aside old OUT and OUT itself then share one real
    directory (renames never cross a device), and a symlink named OUT is replaced as a link."""
    out = Path(output).absolute()
    if out.name in ("", ".", ".."):
        out = out.resolve()
    return out.parent.resolve() / out.name


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path, skip: set[str]) -> None:
    """fsync every file (but the top-level names in skip, synced already) and every
    directory under root, root last."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        d = Path(dirpath)
        for fn in files:
            if d == root and fn in skip:
                continue
            fsync_path(d / fn)
        fsync_path(d)


class AtomicOutput:
    """A context manager: `tmp` is the directory to fill; `commit()` makes it OUT.

        with AtomicOutput(out, force) as dest:
            ... write into dest.tmp ...
            dest.commit(synced=...)    # fsync, move an old OUT aside, rename

    Leaving the block with an exception removes everything it made and puts a
    moved-aside OUT back; leaving it after commit() removes the old OUT and fsyncs the
    parent directories. `out` is the spelling used in messages."""

    def __init__(self, out: Path, force: bool):
        self.out = out
        self.final = output_path(out)  # every filesystem operation uses this spelling
        self.force = force
        self.tmp: Path | None = None
        self._old: Path | None = None
        self._created: list[Path] = []
        self._committed = False

    def __enter__(self) -> AtomicOutput:
        p = self.final.parent
        while not p.exists():
            self._created.append(p)
            p = p.parent
        for d in reversed(self._created):
            d.mkdir()
        self.tmp = self.final.parent / f".{self.final.name}.requant-tmp-{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        return self

    def commit(self, synced: set[str]) -> None:
        """fsync everything under tmp (but the top-level files in `synced`), then rename
        tmp to OUT, moving an existing OUT aside first (force)."""
        final, out = self.final, self.out
        try:
            fsync_tree(self.tmp, skip=synced)
        except OSError as exc:
            raise OutputError(f"syncing the output failed: {os_reason(exc)}", file=out) from exc
        if final.exists() or final.is_symlink():
            if not self.force:  # it appeared while we were converting: never replace it silently
                raise OutputError("appeared while converting; pass --force to replace it", file=out)
            old = final.parent / f".{final.name}.requant-old-{uuid.uuid4().hex[:12]}"
            try:
                os.rename(final, old)
            except OSError as exc:
                raise OutputError(f"moving the existing output aside failed: {os_reason(exc)}", file=out) from exc
            self._old = old
        try:
            os.rename(self.tmp, final)
        except OSError as exc:
            raise OutputError(f"renaming the finished output into place failed: {os_reason(exc)}", file=out) from exc
        self._committed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        final = self.final
        if exc_type is not None or not self._committed:  # failed (or abandoned): leave nothing
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self._old is not None and not (final.exists() or final.is_symlink()):
                os.rename(self._old, final)  # put the replaced output back
                self._old = None
            for d in self._created:
                try:
                    d.rmdir()
                except OSError:
                    break
            return
        old = self._old
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        try:
            for d in [final.parent] + [c.parent for c in self._created]:
                fsync_path(d)  # the renames (and any directories made for OUT) are durable
        except OSError as exc:
            raise OutputError(f"output written, but syncing its directory failed: {os_reason(exc)}", file=self.out) from exc


# -- report files ----------------------------------------------------------------------
def temp_beside(path: Path, suffix: str = ".tmp") -> Path:
    """An empty temporary file in `path`'s directory (made if missing), with the permissions
    a plain open() would give (mkstemp's are 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    os.close(fd)
    return Path(tmp)


def write_files_atomic(items: list[tuple[Path, Callable[[Path], None]]]) -> list[Path]:
    """Each (destination, render) pair: render(temporary path) for every item first, then the
    temporaries are renamed over their destinations; on any failure none is renamed and the
    temporaries are removed. Reports are then all new or all old, never half-written."""
    temps: list[tuple[Path, Path]] = []
    try:
        for dest, render in items:
            dest = Path(dest)
            tmp = temp_beside(dest, dest.suffix + ".tmp")
            temps.append((tmp, dest))
            render(tmp)
    except BaseException:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, dest in temps:
        os.replace(tmp, dest)
    return [dest for _, dest in temps]


def write_json_atomic(path: str | os.PathLike, obj, indent: int = 1) -> Path:
    """`obj` as JSON (indented, newline-terminated) at `path`, atomically."""
    text = json.dumps(obj, indent=indent) + "\n"
    (written,) = write_files_atomic([(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))])
    return written
