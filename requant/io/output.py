"""Atomic output: a checkpoint directory appears complete and durable, or not at all.

* Everything is written into a temporary directory beside OUT (`.OUT.requant-tmp-*`), fsynced,
  and renamed to OUT at the end; on any error or interrupt nothing named OUT appears.
* An existing OUT is only replaced with force=True, and only when it is a checkpoint or empty
  (replaceable()): checked before any work and again just before the rename, where a caller's
  before_replace check also runs (a conversion's: requant.convert.replace, nothing a user wrote
  into OUT is deleted).
* A killed run's temporary directory is removed by the next AtomicOutput for OUT once its lock is free.
* An interrupt that arrives once the rename is done is an OutputInterrupted (a
  KeyboardInterrupt): the output is complete, and its message says so.
* Report files (write_files_atomic, write_bytes_atomic, write_json_atomic) are published as
  a set, all or nothing, durably, only over absent or regular files.

How, and why (links, the fsync order, the lock files, what --force may replace):
docs/checkpoints.md#output, docs/checkpoints.md#reading-and-writing-the-decisions.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import socket
import stat
import tempfile
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

from requant.errors import OutputError, os_reason
from requant.io import leftovers, snapshot
from requant.io.inputs import not_regular
from requant.io.links import LinkError, check_inside, shown
from requant.io.space import full_reason

LOCK_SUFFIX = ".lock"


class OutputInterrupted(KeyboardInterrupt):
    """An interrupt after the output was renamed into place: the output is complete."""

    def __init__(self, out: Path, leftover: Path | None = None):
        self.out = out
        msg = f"interrupted after {shown(out)} was written completely (the output is intact)"
        if leftover is not None and (leftover.exists() or leftover.is_symlink()):
            msg += f"; the replaced output was not fully removed: {shown(leftover)}"
        super().__init__(msg)


def _default_note(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _lock_of(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + LOCK_SUFFIX)


def _take_lock(lock: Path) -> int:
    """Create the lock file holding this process's flock (why so: docs/checkpoints.md); its fd."""
    staging = lock.with_name(f"{lock.name}.{os.getpid()}")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode())
        os.replace(staging, lock)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass
        raise
    return fd


def _try_lock(path: Path) -> tuple[int | None, str]:
    """(fd holding the lock, owner) when path's writer is dead; (None, owner) while it lives."""
    fd = os.open(path, os.O_RDWR)
    owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, owner
    return fd, owner


def sweep_stale(final: Path, on_note: Callable[[str], None]) -> None:
    """Remove the temporary directories that dead runs left for `final` (OUT as output_path
    spells it) and name the leftovers it may not remove (docs/checkpoints.md)."""
    prefix_tmp, prefix_old = f".{final.name}.requant-tmp-", f".{final.name}.requant-old-"
    try:
        entries = sorted(final.parent.iterdir())
    except OSError:
        return
    for d in entries:
        if d.name.startswith(prefix_old):
            on_note(
                f"{shown(d)}: a previous output moved aside by a run that did not finish; left alone (remove it "
                "once you know OUT is the output you want)"
            )
            continue
        if not d.name.startswith(prefix_tmp) or d.is_symlink():
            continue
        if not d.is_dir():  # a lock whose directory is gone (killed in between): removed once its writer is dead
            if d.name.endswith(LOCK_SUFFIX) and not d.with_name(d.name[: -len(LOCK_SUFFIX)]).is_dir():
                try:
                    fd, owner = _try_lock(d)
                except OSError:
                    continue
                if fd is not None:
                    d.unlink(missing_ok=True)
                    os.close(fd)
                    on_note(f"removed {shown(d)}: a lock left by a run that was killed ({owner or 'owner unknown'})")
            else:
                _sweep_staged_lock(d, on_note)
            continue
        try:
            fd, owner = _try_lock(_lock_of(d))
        except OSError:
            on_note(
                f"{shown(d)}: an unfinished output with no lock (not made by a running requant that can be "
                "identified); left alone: remove it if no conversion is writing here"
            )
            continue
        if fd is None:
            on_note(f"{shown(d)}: the unfinished output of a run still writing ({owner}); left alone")
            continue
        try:
            size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())
            shutil.rmtree(d, ignore_errors=True)
            _lock_of(d).unlink(missing_ok=True)
            on_note(f"removed {shown(d)}: {size:,} bytes left by a run that was killed ({owner or 'owner unknown'})")
        finally:
            os.close(fd)


def _sweep_staged_lock(path: Path, on_note: Callable[[str], None]) -> None:
    """A lock file killed before it was renamed into place (`LOCK.PID`, _take_lock): removed
    once no process PID runs."""
    head, _, pid = path.name.rpartition(".")
    if head.endswith(LOCK_SUFFIX) and pid.isdigit() and not leftovers.owner_alive(int(pid)):
        try:
            path.unlink()
        except OSError:
            return
        on_note(f"removed {shown(path)}: a lock left by a run that was killed (pid {pid})")


def _say_left(old: Path, on_note: Callable[[str], None]) -> None:
    """A replaced output that could not be removed (a read-only directory in it): say where it is left."""
    if old.exists() or old.is_symlink():
        on_note(
            f"the replaced output could not be removed completely; what is left of it is at {shown(old)} "
            "(remove it yourself: chmod -R u+w it first if it is read-only)"
        )


def replaceable(path: Path) -> str | None:
    """None when --force may replace path (docs/checkpoints.md), else why not."""
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
        raise OutputError(
            f"already exists and {why}; --force replaces only a checkpoint or an empty directory: "
            "remove it yourself or choose another output",
            file=out,
        )


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
    for dirpath, _dirs, files in os.walk(root, topdown=False):
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

    def __init__(
        self,
        out: Path,
        force: bool,
        on_note: Callable[[str], None] | None = None,
        before_replace: Callable[[Path], None] | None = None,
    ):
        self.out = out
        # called with an existing OUT just before force replaces it (a conversion checks it again
        # for a user's files: requant.convert.replace); it raises to keep OUT
        self.before_replace = before_replace
        self.on_note = on_note or _default_note
        self._lock_fd: int | None = None
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
        sweep_stale(self.final, self.on_note)
        tmp = self.final.parent / f".{self.final.name}.requant-tmp-{uuid.uuid4().hex[:12]}"
        self._lock_path = _lock_of(tmp)
        self._lock_fd = _take_lock(self._lock_path)
        try:
            tmp.mkdir()
        except BaseException:
            self._release()
            raise
        self.tmp = tmp
        return self

    def _release(self) -> None:
        """Remove the lock file, then drop the flock (a sweeper that opened it meanwhile sees
        it unlocked only once the directory it guarded is gone or renamed)."""
        if self._lock_fd is not None:
            self._lock_path.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def commit(self, synced: set[str]) -> None:
        """fsync everything under tmp (but the top-level files in `synced`), then rename
        tmp to OUT, moving an existing OUT aside first (force)."""
        final, out = self.final, self.out
        try:
            fsync_tree(self.tmp, skip=synced)
        except OSError as exc:
            raise OutputError(
                f"syncing the output failed: {full_reason(exc, self.tmp, os_reason(exc))}", file=out
            ) from exc
        snapshot.check()  # the inputs read are still the bytes that were measured (requant.io.snapshot)
        if final.exists() or final.is_symlink():
            if not self.force:  # it appeared while we were converting: never replace it silently
                raise OutputError("appeared while converting; pass --force to replace it", file=out)
            refuse_unless_replaceable(out, final)  # it may have changed meanwhile
            if self.before_replace is not None:
                self.before_replace(final)
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
        snapshot.published()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._finish(exc_type)
        except KeyboardInterrupt:
            if self._committed:
                raise OutputInterrupted(self.out, self._old) from None
            raise
        finally:
            self._release()
        if self._committed and exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            raise OutputInterrupted(self.out) from None

    def _finish(self, exc_type) -> None:
        final = self.final
        if not self._committed:  # failed (or abandoned): leave nothing
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
        old = self._old  # committed: the output is complete, whatever came after the rename
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
            self._old = None
            _say_left(old, self.on_note)
        try:
            for d in [final.parent] + [c.parent for c in self._created]:
                fsync_path(d)  # the renames (and any directories made for OUT) are durable
        except OSError as exc:
            raise OutputError(
                f"output written, but syncing its directory failed: {os_reason(exc)}", file=self.out
            ) from exc


# -- report files ----------------------------------------------------------------------
class WriteError(OutputError, OSError):
    """A report file that could not be written, naming the file (never its temporary); an
    OSError too, for callers that catch those."""


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def file_mode(dest: Path | None = None) -> int:
    """The permissions a new file gets as `cp` would give them: those of the file it replaces,
    else 0666 less the umask (never mkstemp's 0600)."""
    try:
        st = os.stat(dest) if dest is not None else None
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    return 0o666 & ~_umask()


def report_target(path: str | os.PathLike) -> Path:
    """Where a report named `path` is written: `path` when it is absent or a regular file; for
    a symlink, the file it names (the link is kept) when that is a regular file or not there
    yet, inside the link's own directory (requant.io.links' rule with that directory as the root)
    and reached through no link into /proc or /dev. Anything else (a directory, a FIFO, a
    device, a link to /proc/self/fd/1 or out of its directory) is an OutputError naming
    `path`: a report never replaces what is not a report."""
    p = Path(path)
    try:
        lst = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as exc:
        raise OutputError(f"cannot be examined: {os_reason(exc)}", file=shown(p)) from None
    if stat.S_ISLNK(lst.st_mode):
        hop = p
        for _ in range(40):  # a link through /proc (/proc/self/fd/1: whatever stdout is) or /dev is never followed
            if not hop.is_symlink():
                break
            hop = hop.parent / os.readlink(hop)
            if hop.absolute().parts[1:2] in (("proc",), ("dev",)):
                raise OutputError(f"is a link into /{hop.absolute().parts[1]}, not to a report file", file=shown(p))
        try:
            real = check_inside(p.absolute().parent, p)  # links.py's rule, the report's directory as the root
        except LinkError:
            raise OutputError(
                f"is a link to {shown(p.resolve())}, outside its own directory; a report is written through a "
                "link only to a file in the link's directory",
                file=shown(p),
            ) from None
        try:
            st = os.stat(real)
        except FileNotFoundError:
            return real  # a link to a file not written yet, inside the directory
        except OSError as exc:
            raise OutputError(f"is a link to {shown(real)}: {os_reason(exc)}", file=shown(p)) from None
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"is a link to {shown(real)}, which {not_regular(st.st_mode)}", file=shown(p))
        return real
    if not stat.S_ISREG(lst.st_mode):
        raise OutputError(not_regular(lst.st_mode), file=shown(p))
    return p


def temp_beside(path: Path, suffix: str = ".tmp", mode: int | None = None) -> Path:
    """An empty temporary file in `path`'s directory (made if missing), with `mode` (default:
    file_mode(path), the permissions cp would give)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the writer's pid in the name: a killed run's temporary is recognised and swept (requant.io.leftovers)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{leftovers.tag()}", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, file_mode(path) if mode is None else mode)
    finally:
        os.close(fd)
    return Path(tmp)


def _missing_dirs(paths: list[Path]) -> list[Path]:
    """The directories above `paths` that do not exist yet, deepest first (removed again on failure)."""
    missing: list[Path] = []
    for p in paths:
        d = p.parent
        while not (d.exists() or d.is_symlink()) and d != d.parent:
            if d not in missing:
                missing.append(d)
            d = d.parent
    return sorted(missing, key=lambda d: len(d.parts), reverse=True)


def write_files_atomic(items: list[tuple[Path, Callable[[Path], None]]]) -> list[Path]:
    """Publish a set of files all or nothing. Each destination is checked first (report_target:
    absent or a regular file, a symlink followed to a regular file); then render(temporary
    path) for every item, each temporary fsynced; then, each destination checked again, the
    temporaries are renamed over their destinations and the directories fsynced. On any
    failure before the renames none is renamed; a rename that fails puts the files already
    renamed back as they were. Temporaries (and directories made for them) never stay.
    Errors name the destination, never a temporary. Returns the destinations as given."""
    given = [Path(dest) for dest, _ in items]
    targets = [report_target(d) for d in given]  # before any work
    real = [t.absolute().parent.resolve() / t.name for t in targets]
    for i, t in enumerate(real):
        if t in real[:i]:
            raise WriteError(f"names the same file as {shown(given[real.index(t)])}", file=shown(given[i]))
    for t in targets:
        leftovers.sweep_beside(t)  # a killed run's temporaries of this report
    made = _missing_dirs(targets)
    temps: list[Path] = []
    backups: dict[int, Path] = {}
    existed: set[int] = set()
    renamed: list[int] = []
    try:
        for i, ((_, render), dest) in enumerate(zip(items, targets)):
            try:
                tmp = temp_beside(dest, dest.suffix + ".tmp")
            except OSError as exc:
                why = full_reason(exc, dest, os_reason(exc))
                raise WriteError(f"cannot be written: {why}", file=shown(given[i])) from None
            temps.append(tmp)
            try:
                render(tmp)
                fsync_path(tmp)
            except OSError as exc:
                raise WriteError(
                    f"writing failed: {full_reason(exc, dest, os_reason(exc))}", file=shown(given[i])
                ) from None
        snapshot.check()  # a report is only published for the bytes it measured (requant.io.snapshot)
        for i, dest in enumerate(targets):
            report_target(dest)  # it may have changed while rendering: never rename over a non-regular file
            if dest.exists():
                existed.add(i)
                backup = dest.with_name(f".{dest.name}.{leftovers.tag('old')}{uuid.uuid4().hex[:12]}")
                try:
                    os.link(dest, backup)  # a second name for the old file, so that a failed set can be put back
                    backups[i] = backup
                except OSError:
                    pass  # no hard links here: that file is replaced without a way back
        for i, (tmp, dest) in enumerate(zip(temps, targets)):
            try:
                os.replace(tmp, dest)
            except OSError as exc:
                raise WriteError(f"renaming into place failed: {os_reason(exc)}", file=shown(given[i])) from None
            renamed.append(i)
    except BaseException:
        for i in reversed(renamed):  # put back what was replaced already; remove what was new
            if i in backups:
                os.replace(backups.pop(i), targets[i])
            elif i not in existed:
                targets[i].unlink(missing_ok=True)
        for p in [*temps, *backups.values()]:
            p.unlink(missing_ok=True)
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    snapshot.published()
    for b in backups.values():
        b.unlink(missing_ok=True)
    dirs = {t.parent for t in targets} | {d.parent for d in made}
    try:
        for d in dirs:
            fsync_path(d)
    except OSError as exc:
        raise WriteError(f"written, but syncing its directory failed: {os_reason(exc)}", file=shown(given[0])) from None
    except KeyboardInterrupt:  # every file is in place: say so instead of "nothing was written"
        raise OutputInterrupted(Path(", ".join(shown(g) for g in given))) from None
    return given


def finite(obj):
    """obj with every non-finite float (NaN, +-Infinity) replaced by None: JSON has no literal
    for them, and a report must parse with any JSON reader."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_bytes(obj, indent: int | None = 1, *, row_lines: bool = False, **kwargs) -> bytes:
    """obj as standard JSON (non-finite numbers as null), newline-terminated, UTF-8.

    row_lines (a report's long tables, e.g. an MoE audit's half a million cell rows): a list of
    more than ROW_LINES dicts is written one dict per line by the C encoder, the rest indented as
    usual. Python's json indents in pure Python (about 25 us a row, most of writing a 200 MB
    report); the same document, parsed, either way."""
    if not row_lines or indent is None or kwargs:
        return (json.dumps(finite(obj), indent=indent, allow_nan=False, **kwargs) + "\n").encode("utf-8")
    try:
        text = _dumps_rows(obj, indent, 0)
    except ValueError:  # a NaN or infinity somewhere: the C encoder refuses it; null it and write again
        text = _dumps_rows(finite(obj), indent, 0)
    return (text + "\n").encode("utf-8")


ROW_LINES = 64
_ROW = json.JSONEncoder(allow_nan=False)  # no indent: the C encoder


def _key(k) -> str:
    """A dict key as json writes it (json.dumps turns True into "true", 1.5 into "1.5")."""
    if isinstance(k, str):
        return k
    if isinstance(k, (bool, int, float)) or k is None:
        return _ROW.encode(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def _dumps_rows(obj, indent: int, level: int) -> str:
    """json.dumps(obj, indent=indent) but for row_lines' long lists of dicts (json_bytes)."""
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(obj, dict) and obj:
        items = (f"{inner}{_ROW.encode(_key(k))}: {_dumps_rows(v, indent, level + 1)}" for k, v in obj.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)) and obj:
        if len(obj) > ROW_LINES and all(isinstance(v, dict) for v in obj):
            return "[\n" + ",\n".join(inner + _ROW.encode(v) for v in obj) + "\n" + pad + "]"
        return "[\n" + ",\n".join(inner + _dumps_rows(v, indent, level + 1) for v in obj) + "\n" + pad + "]"
    return _ROW.encode(obj)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """`data` at `path`, atomically and durably (write_files_atomic)."""
    (written,) = write_files_atomic([(Path(path), lambda tmp: tmp.write_bytes(data))])
    return written


def write_json_atomic(path: str | os.PathLike, obj, indent: int = 1) -> Path:
    """`obj` as JSON (json_bytes: indented, newline-terminated, no NaN literal) at `path`, atomically."""
    return write_bytes_atomic(path, json_bytes(obj, indent=indent))
