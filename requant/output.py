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
  * --force replaces only what it can tell is a checkpoint (replaceable(): an empty
    directory, a directory with config.json and .safetensors weights at its top level, or a
    symlink, which is replaced as a link and whose target is left alone). Anything else (a
    file, a directory of other things) is refused, before any work and again at the rename,
    and nothing is touched: `-o ~/models --force` must never delete a directory of models.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from requant.errors import OutputError
from requant.safetensors_io import os_reason


def replaceable(path: Path) -> str | None:
    """None when --force may replace path (see the module docstring), else why not."""
    if path.is_symlink():
        return None
    if not path.is_dir():
        return "is not a directory"
    try:
        names = [p.name for p in path.iterdir()]
    except OSError as exc:
        return f"cannot be listed ({os_reason(exc)})"
    if not names:
        return None
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        return None
    return "is not a checkpoint (no config.json with .safetensors weights) and not empty"


def refuse_unless_replaceable(out: Path, final: Path) -> None:
    why = replaceable(final)
    if why is not None:
        raise OutputError(f"already exists and {why}; --force replaces only a checkpoint or an empty directory: "
                          "remove it yourself or choose another output", file=out)


def check_output(src: Path, out: Path, force: bool) -> None:
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise OutputError(f"output would be inside the source checkpoint {s}; requant never writes there", file=out)
    if o in s.parents:
        raise OutputError(f"output contains the source checkpoint {s}; replacing it would destroy the source", file=out)
    if out.exists() or out.is_symlink():
        if not force:
            raise OutputError("already exists; pass --force to replace it", file=out)
        refuse_unless_replaceable(out, output_path(out))


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
            refuse_unless_replaceable(out, final)  # it may have changed meanwhile
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
