"""The converter's units of work: shards streamed, piece by piece, into output shards.

Why the headers and offsets are kept: docs/checkpoints.md#output.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from requant.checkpoint import SKIP_DIRS, Checkpoint
from requant.convert._workers import Aborted, run_units, shutdown
from requant.errors import OutputError, TensorError, os_reason
from requant.evidence.manifest import walk_files
from requant.io.safetensors_io import pread_exact, tensor_to_bytes
from requant.io.space import full_reason
from requant.scales.from_source import quantize_from_source
from requant.scales.requantizer import LinearStats, Requantizer

# Pieces small enough to stay in the CPU cache between read, requantize and write
# (measured here: 16 MB pieces made the kernel's copies ~2x slower than 1 MB ones).
CHUNK = 1 << 20
BLOCK_BYTES = 1 << 20
SEGMENT = 64 << 20  # bytes of tensor data per unit of parallel work


def segments(f) -> list[list]:
    """Split a shard's tensors (in file order) into segments of about SEGMENT bytes, the
    units of parallel work. The split depends only on the header, never on the number of
    workers."""
    out, cur, size = [], [], 0
    for info in f.by_offset:
        cur.append(info)
        size += info.nbytes
        if size >= SEGMENT:
            out.append(cur)
            cur, size = [], 0
    if cur or not out:
        out.append(cur)
    return out


def _pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


def copy_other_files(ckpt: Checkpoint, tmp: Path, out: Path, arm: str = "unconstrained") -> None:
    """Copy every file that is not a shard (config and index included) byte for byte,
    following symlinks inside the checkpoint (Hub snapshots link into the blob cache) and
    refusing one that leads out of it (requant.evidence.manifest.walk_files, before anything is copied).

    The source's README.md is the exception under a constrained arm: its text describes the
    source's scales, so the output gets readme_stub() instead (its front matter, license and
    base model, kept verbatim for `requant card`); `unconstrained` copies it like every file."""
    skip = set(ckpt.shards)
    for rel, src in walk_files(ckpt.path, SKIP_DIRS).items():
        if rel in skip:
            continue
        dst = tmp / rel
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel == README and arm != "unconstrained":
                dst.write_bytes(readme_stub(src.read_bytes(), arm))
            else:
                shutil.copyfile(src, dst)
        except OSError as exc:
            raise OutputError(f"copying {src} failed: {full_reason(exc, tmp, os_reason(exc))}", file=out / rel) from exc


README = "README.md"


def readme_stub(source_readme: bytes, arm: str) -> bytes:
    """The README.md of a converted checkpoint until `requant card` writes its card: the
    source README's YAML front matter unchanged (where the card takes license and base model
    from), then three lines saying what this is and that the card comes from `requant card`."""
    text = source_readme.decode("utf-8", errors="replace")
    front = ""
    if text.startswith("---\n") or text.startswith("---\r\n"):
        end = text.find("\n---", 3)
        if end != -1:
            stop = text.find("\n", end + 4)
            front = text[: len(text) if stop == -1 else stop + 1]
            if not front.endswith("\n"):
                front += "\n"
    body = (
        f"# Converted by requant (arm {arm})\n\n"
        "The source's model card described the source's weight scales, so it is not copied here.\n"
        "Write this checkpoint's card from its reports with `requant card DIR`.\n"
    )
    return (front + ("\n" if front else "") + body).encode("utf-8")


class Job:
    """Shared state of one conversion: output fds, per-worker buffers, statistics."""

    def __init__(
        self, ckpt: Checkpoint, tmp: Path, out: Path, arm: str, source, progress: Callable[[int], None] | None
    ):  # noqa: D107
        self.ckpt, self.tmp, self.out, self.arm, self.source = ckpt, tmp, out, arm, source
        self.progress = progress or (lambda n: None)
        self.fds: dict[str, int] = {}
        self.stats: dict[str, LinearStats] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        self.weight_to_linear = {lin + ".weight": lin for lin in ckpt.quantized_linears}
        self.scales = {lin + ".weight_scale" for lin in ckpt.quantized_linears}

    # -- output shards ----------------------------------------------------------------
    def write(self, shard: str, data, offset: int, tensor: str | None) -> None:
        """pwrite into an output shard; an OSError becomes an OutputError naming the
        output shard (as OUT/<shard>, written under the temporary directory) and tensor."""
        try:
            _pwrite_all(self.fds[shard], data, offset)
        except OSError as exc:
            raise OutputError(
                f"writing the output shard failed: {full_reason(exc, self.tmp, os_reason(exc))}",
                file=self.out / shard,
                tensor=tensor,
            ) from exc

    def create_outputs(self) -> None:
        for name, f in self.ckpt.shards.items():
            try:
                fd = os.open(self.tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask, as cp
            except OSError as exc:
                why = full_reason(exc, self.tmp, os_reason(exc))
                raise OutputError(f"creating the output shard failed: {why}", file=self.out / name) from exc
            self.fds[name] = fd
            self.write(name, f.prefix, 0, None)  # the rest is written at its offsets (no ftruncate: slower on ext4)

    def flush_early(self, shard: str) -> None:
        """Start write-back of a shard (fdatasync) as its units finish, so that the final
        fsync does not wait for the whole output at once. Errors are left to sync()."""
        try:
            os.fdatasync(self.fds[shard])
        except OSError:
            pass  # reported by sync(), which fsyncs every shard at the end

    def sync(self) -> None:
        """fsync every output shard (before it is closed and the directory renamed)."""
        for name, fd in self.fds.items():
            try:
                os.fsync(fd)
            except OSError as exc:
                why = full_reason(exc, self.tmp, os_reason(exc))
                raise OutputError(f"syncing the output shard failed: {why}", file=self.out / name) from exc

    def check_sizes(self) -> None:
        for name, fd in self.fds.items():
            size = os.fstat(fd).st_size
            if size != self.ckpt.shards[name].file_size:  # every byte is written exactly once
                raise TensorError(
                    f"internal: output shard is {size} bytes, expected {self.ckpt.shards[name].file_size}",
                    file=self.tmp / name,
                )

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    # -- units ------------------------------------------------------------------------
    def _buffers(self, n_in: int, n_out: int):
        """Per-worker buffers, reused across tensors: a raw input buffer (bytearray) and an
        int8 output buffer. Fresh buffers per tensor would cost a page fault and a page
        zeroing for every 4 KB of the model."""
        loc = self.local
        if getattr(loc, "inbuf", None) is None or len(loc.inbuf) < n_in:
            loc.inbuf = bytearray(max(n_in, CHUNK))
        if getattr(loc, "outbuf", None) is None or loc.outbuf.size < n_out:
            loc.outbuf = np.empty(max(n_out, 1), dtype=np.int8)
        return loc.inbuf, loc.outbuf

    def linear(self, shard: str, lin: str, fd_in: int, should_stop: Callable[[], bool]) -> None:
        """Requantize one Linear, its weight streamed in blocks of rows: each block is
        read, requantized and written while it is still in the CPU cache."""
        ckpt = self.ckpt
        wname, sname = lin + ".weight", lin + ".weight_scale"
        f = ckpt.shards[shard]
        winfo = f.info(wname)
        sfile = ckpt.shard_of(sname)
        sinfo = sfile.info(sname)
        scale = sfile.tensor(sname)
        rows, cols = winfo.shape
        start = f.data_start + winfo.begin
        step = max(1, BLOCK_BYTES // max(cols, 1))
        inbuf, outbuf = self._buffers(step * cols, step * cols)
        try:
            if self.source is None:
                rq = Requantizer(scale, self.arm, cols)
            for r0 in range(0, rows, step):
                n = min(step, rows - r0)
                view = memoryview(inbuf)[: n * cols]
                pread_exact(fd_in, view, start + r0 * cols, file=f.path, tensor=wname)
                if self.source is None:
                    qb = np.frombuffer(view, dtype=np.int8).reshape(n, cols)
                    qb_new = rq.rows(qb, r0, outbuf[: n * cols].reshape(n, cols))
                    self.write(shard, qb_new, start + r0 * cols, wname)
                    del qb, qb_new
                view.release()
                self.progress(n * cols)
                if should_stop():
                    raise Aborted()
            if self.source is None:
                s_new, st = rq.finish()
            else:
                w = self.source.tensor(wname)
                q_new, s_new, st = quantize_from_source(w, self.arm, scale.dtype)
                if tuple(q_new.shape) != winfo.shape:
                    raise TensorError("internal: source arm changed the shape", file=f.path, tensor=wname)
                if winfo.nbytes:
                    self.write(shard, q_new.contiguous().numpy(), start, wname)
        except ValueError as exc:
            raise TensorError(str(exc), file=f.path, tensor=wname) from None
        if s_new.dtype != scale.dtype or tuple(s_new.shape) != sinfo.shape:  # an arm's contract, checked
            raise TensorError(
                f"internal: arm {self.arm} changed the scale's dtype or shape", file=sfile.path, tensor=sname
            )
        sshard = ckpt.weight_map[sname]
        self.write(sshard, tensor_to_bytes(s_new), ckpt.shards[sshard].data_start + sinfo.begin, sname)
        with self.lock:
            self.stats[lin] = st

    def segment(self, unit: tuple[str, list], should_stop: Callable[[], bool]) -> None:
        """Convert one unit (shard name, consecutive tensors in file order).

        Tensors are handled in cache-sized pieces read into reused buffers, and either
        written straight back (pass-through) or requantized. should_stop() is
        polled after every piece (requant.convert._workers decides who stops)."""
        name, infos = unit
        f = self.ckpt.shards[name]
        try:
            fd_in = os.open(f.path, os.O_RDONLY)
        except OSError as exc:
            raise TensorError(f"opening the source shard failed: {os_reason(exc)}", file=f.path) from exc
        try:
            for info in infos:
                if should_stop():
                    raise Aborted()
                if info.name in self.weight_to_linear:
                    self.linear(name, self.weight_to_linear[info.name], fd_in, should_stop)
                    continue
                start = f.data_start + info.begin
                inbuf, _ = self._buffers(CHUNK, 0)
                for pos in range(0, info.nbytes, CHUNK):
                    n = min(CHUNK, info.nbytes - pos)
                    view = memoryview(inbuf)[:n]
                    pread_exact(fd_in, view, start + pos, file=f.path, tensor=info.name)
                    if info.name not in self.scales:  # scales are written with their weight
                        self.write(name, view, start + pos, info.name)
                    view.release()
                    self.progress(n)
                    if should_stop():
                        raise Aborted()
        finally:
            os.close(fd_in)


def run(job: Job, units: list[tuple[str, list]], workers: int) -> None:
    """Run every unit (shard name, tensors) of `job`. Returns or raises (the first failing unit's error, requant.convert._workers) only once
    every worker has stopped, so the output fds may then be closed.

    Write-back starts as units finish (one thread, fdatasync of that unit's shard), so the
    final fsync does not wait for the whole output at once; a failure stops it."""
    flusher = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="requant-flush")
    flushing: dict[str, cf.Future] = {}

    def on_done(i: int) -> None:
        name = units[i][0]
        if name not in flushing or flushing[name].done():
            flushing[name] = flusher.submit(job.flush_early, name)

    try:
        run_units(job.segment, units, workers, on_done)
    finally:
        shutdown(flusher)
