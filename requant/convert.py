"""`requant convert`: rewrite a W8A8 checkpoint's weight scales under one arm, safely.

How, and why this way:
  * Validate everything first (requant.checkpoint.open_checkpoint: config, every shard
    header, every scale) so that a bad input fails before a byte is written.
  * Requantizing never changes a tensor's dtype or shape, so every output shard keeps its
    input's header bytes exactly and every tensor keeps its offsets. Each output shard is
    created at full size with the input's header, then filled with pwrite at the input's
    offsets: pass-through tensors are copied in 16 MB chunks, quantized Linears are
    requantized one at a time (a Linear's weight and scale may even live in different
    shards). Memory is bounded by one weight per worker plus small buffers, not by the model.
  * The work is cut into segments of ~64 MB of consecutive tensors (fixed by the headers),
    run in a bounded thread pool (numpy, hashing and file I/O release the GIL), so the
    cores stay busy even when shards are unevenly sized.
  * Provenance anyone can check (requant.manifest): while the segments are converted,
    background threads compute the plain sha256 of every source file (one sequential pass
    per file: sha256 cannot be split across parallel segments, and the source's pages are
    in the page cache anyway); once the shards are written, they are read back and hashed
    while fsync waits for the disk, and the small files after them. A constrained arm writes
    SHA256SUMS.source (the source's files) and SHA256SUMS (the output's, covering
    SHA256SUMS.source and config.json), and its statistics as requant-convert.json
    (deterministic: no times, no output path). Files a source converted earlier carries
    (its manifests, its card, its reports) are copied like any other file; the manifests
    and the statistics are then replaced, and a report of the source's bytes no longer
    matches the output's digest (requant card sets it aside, saying so).
  * Atomic: everything is written into a temporary directory in OUT's own parent
    directory (`.OUT.requant-tmp-*`; OUT's last component is not resolved, so a symlinked
    OUT is replaced as a link, never followed) that is renamed to OUT at the end; on any
    error or interrupt it is removed, and nothing named OUT appears. Every output file and
    directory is fsynced before the rename, the parent directory after it (write-back of
    a shard starts as each of its segments finishes, so the final fsync is short). OUT inside SRC
    (or SRC inside OUT) is refused, and an existing OUT is only replaced with force=True
    (checked again just before the rename: an OUT that appeared meanwhile is an error).
  * Errors name the file: a failed read names the source shard and tensor (TensorError),
    a failed write the output shard and tensor (OutputError); when several pieces of work
    fail, all are reported, in file order.
  * unconstrained reproduces every file byte for byte (config.json and the index are
    copied, not re-serialised) and adds nothing: no manifest, no report, so that
    `requant verify SRC OUT` stays a byte-exact proof of the reader and writer (the output's
    manifest is the source's; `requant manifest OUT --write` adds one). A constrained arm
    adds a short "requant" key (provenance) to config.json: arm, servable, tool version,
    source (Hub id and resolved commit, or path), the manifests' names; quantization_config
    is left as it was, so compressed-tensors and vLLM load the result unchanged.
  * With `source` (a directory of the original bf16 weights), quantized Linears are made
    from those instead of the int8 ones (requant.arms.quantize_from_source); with the
    unconstrained arm this is llm-compressor's RTN and reproduces an RTN-made SRC.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import requant
from requant import arms as arms_mod
from requant import manifest as mf
from requant.checkpoint import CONFIG, Checkpoint, open_checkpoint, open_source_weights
from requant.errors import CheckpointError, OutputError, TensorError
from requant.safetensors_io import tensor_to_bytes

PROVENANCE_KEY = "requant"
CONVERT_REPORT = "requant-convert.json"
# Pieces small enough to stay in the CPU cache between read, hash, requantize and write
# (measured here: 16 MB pieces made the kernel's copies ~2x slower than 1 MB ones).
CHUNK = 1 << 20
BLOCK_BYTES = 1 << 20
SEGMENT = 64 << 20  # bytes of tensor data per unit of parallel work
SKIP_DIRS = {".cache", ".git"}


@dataclass
class ConvertResult:
    output: Path
    arm: str
    source: str
    layers: dict[str, arms_mod.LinearStats] = field(default_factory=dict)  # in model order
    provenance: dict | None = None
    source_digest: str = ""  # the manifest digest of the source (sha256 of its SHA256SUMS.source)
    manifest_digest: str | None = None  # of the output's SHA256SUMS (None: unconstrained writes none)
    elapsed_s: float = 0.0
    bytes_total: int = 0

    def totals(self) -> dict:
        st = list(self.layers.values())
        sq_err = sum(s.sq_error for s in st)
        sq_norm = sum(s.sq_norm for s in st)
        shifts: dict[int, int] = {}
        for s in st:
            for k, v in s.exponent_shifts.items():
                shifts[k] = shifts.get(k, 0) + v
        return {
            "linears": len(st),
            "channels": sum(s.rows for s in st),
            "weights": sum(s.rows * s.cols for s in st),
            "scales_changed": sum(s.scales_changed for s in st),
            "exponent_shifts": {str(k): v for k, v in sorted(shifts.items())},
            "weights_clipped": sum(s.weights_clipped for s in st),
            "rel_weight_error": (sq_err / sq_norm) ** 0.5 if sq_norm else 0.0,
        }

    def to_dict(self) -> dict:
        return {
            "tool": "requant",
            "version": requant.__version__,
            "arm": self.arm,
            "servable": arms_mod.SERVABLE[self.arm],
            "source": self.source,
            "source_digest": self.source_digest,
            "manifest_digest": self.manifest_digest,
            "output": str(self.output),
            "elapsed_s": round(self.elapsed_s, 3),
            "bytes": self.bytes_total,
            "totals": self.totals(),
            "layers": {name: s.to_dict() for name, s in self.layers.items()},
            "provenance": self.provenance,
        }


def check_output(src: Path, out: Path, force: bool) -> None:
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise OutputError(f"output would be inside the source checkpoint {s}; requant never writes there", file=out)
    if o in s.parents:
        raise OutputError(f"output contains the source checkpoint {s}; replacing it would destroy the source", file=out)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputError("already exists; pass --force to replace it", file=out)


def _pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path, skip: set[str]) -> None:
    """fsync every file (but the top-level names in skip, synced already) and every
    directory under root, root last."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        d = Path(dirpath)
        for fn in files:
            if d == root and fn in skip:
                continue
            _fsync_path(d / fn)
        _fsync_path(d)


class _Job:
    """Shared state of one conversion: output fds, an abort flag, progress."""

    def __init__(self, ckpt: Checkpoint, tmp: Path, out: Path, arm: str, source, progress: Callable[[int], None] | None):  # noqa: D107
        self.ckpt, self.tmp, self.out, self.arm, self.source = ckpt, tmp, out, arm, source
        self.progress = progress or (lambda n: None)
        self.abort = threading.Event()
        self.fds: dict[str, int] = {}
        self.stats: dict[str, arms_mod.LinearStats] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        self.weight_to_linear = {lin + ".weight": lin for lin in ckpt.quantized_linears}
        self.scales = {lin + ".weight_scale" for lin in ckpt.quantized_linears}

    def write(self, shard: str, data, offset: int, tensor: str | None) -> None:
        """pwrite into an output shard; an OSError becomes an OutputError naming the
        output shard (as OUT/<shard>, written under the temporary directory) and tensor."""
        try:
            _pwrite_all(self.fds[shard], data, offset)
        except OSError as exc:
            raise OutputError(f"writing the output shard failed: {_os_reason(exc)}", file=self.out / shard, tensor=tensor) from exc

    def create_outputs(self) -> None:
        for name, f in self.ckpt.shards.items():
            try:
                fd = os.open(self.tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as exc:
                raise OutputError(f"creating the output shard failed: {_os_reason(exc)}", file=self.out / name) from exc
            self.fds[name] = fd
            self.write(name, f.prefix, 0, None)  # the rest is written at its offsets (no ftruncate: slower on ext4)

    def flush_early(self, shard: str) -> None:
        if self.abort.is_set():
            return
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
                raise OutputError(f"syncing the output shard failed: {_os_reason(exc)}", file=self.out / name) from exc

    def check_sizes(self) -> None:
        for name, fd in self.fds.items():
            size = os.fstat(fd).st_size
            if size != self.ckpt.shards[name].file_size:  # every byte is written exactly once
                raise TensorError(f"internal: output shard is {size} bytes, expected {self.ckpt.shards[name].file_size}", file=self.tmp / name)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

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

    def linear(self, shard: str, lin: str, fd_in: int) -> None:
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
                rq = arms_mod.Requantizer(scale, self.arm, cols)
            for r0 in range(0, rows, step):
                n = min(step, rows - r0)
                view = memoryview(inbuf)[: n * cols]
                _pread_exact(fd_in, view, start + r0 * cols, f.path, wname)
                if self.source is None:
                    qb = np.frombuffer(view, dtype=np.int8).reshape(n, cols)
                    qb_new = rq.rows(qb, r0, outbuf[: n * cols].reshape(n, cols))
                    self.write(shard, qb_new, start + r0 * cols, wname)
                    del qb, qb_new
                view.release()
                self.progress(n * cols)
                if self.abort.is_set():
                    raise _Aborted()
            if self.source is None:
                s_new, st = rq.finish()
            else:
                w = self.source.tensor(wname)
                q_new, s_new, st = arms_mod.quantize_from_source(w, self.arm, scale.dtype)
                if tuple(q_new.shape) != winfo.shape:
                    raise TensorError("internal: source arm changed the shape", file=f.path, tensor=wname)
                if winfo.nbytes:
                    self.write(shard, q_new.contiguous().numpy(), start, wname)
        except ValueError as exc:
            raise TensorError(str(exc), file=f.path, tensor=wname) from None
        if s_new.dtype != scale.dtype or tuple(s_new.shape) != sinfo.shape:  # an arm's contract, checked
            raise TensorError(f"internal: arm {self.arm} changed the scale's dtype or shape", file=sfile.path, tensor=sname)
        sshard = ckpt.weight_map[sname]
        self.write(sshard, tensor_to_bytes(s_new), ckpt.shards[sshard].data_start + sinfo.begin, sname)
        with self.lock:
            self.stats[lin] = st

    def segment(self, name: str, infos: list) -> None:
        """Convert one segment of a shard (consecutive tensors in file order).

        Tensors are handled in cache-sized pieces read into reused buffers (pread), and
        either written straight back (pass-through) or requantized."""
        f = self.ckpt.shards[name]
        try:
            fd_in = os.open(f.path, os.O_RDONLY)
        except OSError as exc:
            raise TensorError(f"opening the source shard failed: {_os_reason(exc)}", file=f.path) from exc
        try:
            for info in infos:
                if self.abort.is_set():
                    raise _Aborted()
                if info.name in self.weight_to_linear:
                    self.linear(name, self.weight_to_linear[info.name], fd_in)
                    continue
                start = f.data_start + info.begin
                inbuf, _ = self._buffers(CHUNK, 0)
                for pos in range(0, info.nbytes, CHUNK):
                    n = min(CHUNK, info.nbytes - pos)
                    view = memoryview(inbuf)[:n]
                    _pread_exact(fd_in, view, start + pos, f.path, info.name)
                    if info.name not in self.scales:  # scales are written with their weight
                        self.write(name, view, start + pos, info.name)
                    view.release()
                    self.progress(n)
                    if self.abort.is_set():
                        raise _Aborted()
        except BaseException:
            self.abort.set()  # at once: units not yet started stop instead of failing too
            raise
        finally:
            os.close(fd_in)


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


def _pread_exact(fd: int, view: memoryview, offset: int, path, tensor: str) -> None:
    got = 0
    while got < len(view):
        try:
            n = os.preadv(fd, [view[got:]], offset + got)
        except OSError as exc:
            raise TensorError(f"reading the source shard failed: {_os_reason(exc)}", file=path, tensor=tensor) from exc
        if n == 0:
            raise TensorError("file ended while reading (changed since it was validated?)", file=path, tensor=tensor)
        got += n


class _Aborted(Exception):
    pass


def _copy_other_files(ckpt: Checkpoint, tmp: Path, out: Path) -> None:
    """Copy every file that is not a shard (config and index included) byte for byte."""
    skip = set(ckpt.shards)
    for root, dirs, files in os.walk(ckpt.path, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        rel_root = Path(root).relative_to(ckpt.path)
        for fn in sorted(files):
            rel = rel_root / fn
            if rel.parts == (fn,) and fn in skip:
                continue
            dst = tmp / rel
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(root) / fn, dst)  # follows symlinks (Hub snapshots)
            except OSError as exc:
                raise OutputError(f"copying {Path(root) / fn} failed: {_os_reason(exc)}", file=out / rel) from exc


def _write_config(ckpt: Checkpoint, tmp: Path, provenance: dict) -> None:
    raw = (ckpt.path / CONFIG).read_bytes()
    cfg = json.loads(raw.decode("utf-8"))
    keys = list(cfg)
    was_sorted = keys == sorted(keys)
    cfg.pop(PROVENANCE_KEY, None)  # re-converting a converted checkpoint: the new one wins
    cfg[PROVENANCE_KEY] = provenance
    if was_sorted:
        cfg = dict(sorted(cfg.items()))
    (tmp / CONFIG).write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def provenance_for(arm: str, src_label: str, ckpt: Checkpoint, source_dir: str | None) -> dict:
    """config.json's "requant" key: short; the evidence lives in the manifests it names."""
    if ckpt.from_hub:  # a Hub id that snapshot_download resolved: the snapshot's folder is the commit
        commit = ckpt.path.name
        source = {"id": src_label, "revision": commit if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit) else None}
    else:
        source = {"path": src_label}
    prov = {
        "arm": arm,
        "servable": arms_mod.SERVABLE[arm],
        "version": requant.__version__,
        "source": source,
        "manifest": mf.MANIFEST,
        "source_manifest": mf.SOURCE_MANIFEST,
    }
    if source_dir is not None:
        prov["bf16_source"] = source_dir
    if arm == "probe":
        prov["warning"] = ("ABLATION ONLY, NOT SERVABLE: scales rewritten to the nearest power of two "
                           "without requantizing the int8 weights (the flawed +157% perplexity construction)")
    return prov


def _write_evidence(tmp: Path, out: Path, source_entries: dict, shard_entries: dict, result: "ConvertResult") -> str:
    """SHA256SUMS.source, then SHA256SUMS of everything in tmp (the shards hashed already,
    read back while they were being synced; the rest now), then the statistics
    (requant-convert.json, not covered). Returns the output's manifest digest."""
    try:
        mf.write_atomic(tmp / mf.SOURCE_MANIFEST, mf.render(source_entries))
        entries = mf.compute(tmp, known=shard_entries)
        data = mf.render(entries)
        mf.write_atomic(tmp / mf.MANIFEST, data)
        result.manifest_digest = mf.digest_of(data)
        report = {k: v for k, v in result.to_dict().items() if k not in ("output", "elapsed_s")}  # deterministic
        (tmp / CONVERT_REPORT).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"writing the manifests failed: {_os_reason(exc)}", file=out) from exc
    return result.manifest_digest


def _output_path(output: str | os.PathLike) -> Path:
    """OUT as an absolute path whose parent is resolved but whose last component is not:
    the temporary directory, the moved-aside old OUT and OUT itself then share one real
    directory (renames never cross a device), and a symlink named OUT is replaced as a link."""
    out = Path(output).absolute()
    if out.name in ("", ".", ".."):
        out = out.resolve()
    return out.parent.resolve() / out.name


def _shutdown(pool: cf.ThreadPoolExecutor, abort: threading.Event) -> None:
    """Wait until every worker has stopped (the output fds must outlive them), even
    through a Ctrl-C, which sets the abort flag (workers see it within one piece) and is
    raised again once the workers are gone."""
    interrupted = None
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            break
        except KeyboardInterrupt as exc:
            abort.set()
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _combined_error(errors: list[BaseException]) -> BaseException:
    """One exception for the failed units, given in unit (file) order: the first as is,
    or, when several CheckpointErrors failed, the first's type with every message."""
    if len(errors) == 1 or not all(isinstance(e, CheckpointError) for e in errors):
        return errors[0]
    first = errors[0]
    more = "; ".join(str(e) for e in errors[1:])
    exc = type(first)(f"{first.detail} (and {len(errors) - 1} more: {more})", file=first.file, tensor=first.tensor)
    exc.__cause__ = first.__cause__
    return exc


def _run_units(job: _Job, units: list, workers: int) -> None:
    """Run every unit (shard name, index, tensors) in a thread pool. On a failure the others
    are told to stop, every worker is waited for, and the failures are raised in unit order
    (a deterministic message)."""
    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="requant-convert")
    # Write-back starts as units finish (one thread, fdatasync of that unit's shard), so the
    # final fsync does not wait for the whole output at once. Its errors are left to the
    # final fsync (_Job.sync), which reports them.
    flusher = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="requant-flush")
    flushing: dict[str, cf.Future] = {}
    futures = []
    failed = True
    try:
        futures = [pool.submit(job.segment, name, seg) for name, _, seg in units]
        unit_shard = {f: name for f, (name, _, _) in zip(futures, units)}
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                break
            for f in done:
                name = unit_shard[f]
                if name not in flushing or flushing[name].done():
                    flushing[name] = flusher.submit(job.flush_early, name)
        else:
            failed = False
    finally:
        if failed:
            job.abort.set()
        _shutdown(pool, job.abort)
        _shutdown(flusher, job.abort)
    if failed:
        errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
        errors = [e for e in errors if not isinstance(e, _Aborted)] or errors
        raise _combined_error(errors)


def convert(src: str | os.PathLike, output: str | os.PathLike, arm: str = "nearest", *, force: bool = False,
            revision: str | None = None, source: str | os.PathLike | None = None, jobs: int | None = None,
            progress: Callable[[int], None] | None = None, on_start: Callable[[int], None] | None = None) -> ConvertResult:
    """Convert SRC into OUTPUT under `arm`. Raises CheckpointError on bad input or output.

    progress(n) is called with each batch of bytes processed (from worker threads);
    on_start(total_bytes) once before work begins."""
    if arm not in arms_mod.ARMS:
        raise CheckpointError(f"unknown arm {arm!r}; known: {', '.join(arms_mod.ARMS)}")
    t0 = time.perf_counter()
    ckpt = open_checkpoint(src, revision=revision)
    src_weights = open_source_weights(source, ckpt) if source is not None else None
    out = Path(output)
    final = _output_path(out)  # every filesystem operation below uses this spelling
    check_output(ckpt.path, out, force)
    if src_weights is not None:
        check_output(Path(source), out, force)

    created_parents = []
    p = final.parent
    while not p.exists():
        created_parents.append(p)
        p = p.parent
    for d in reversed(created_parents):
        d.mkdir()
    tmp = final.parent / f".{final.name}.requant-tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    total = sum(f.file_size for f in ckpt.shards.values())
    if on_start:
        on_start(total)
    job = _Job(ckpt, tmp, out, arm, src_weights, progress)
    old = None
    source_hashes = out_hashes = None
    try:
        source_hashes = mf.BackgroundHashes(ckpt.path)  # plain sha256 of every source file, beside the conversion
        _copy_other_files(ckpt, tmp, out)
        job.create_outputs()
        units = [(name, i, seg) for name, f in ckpt.shards.items() for i, seg in enumerate(segments(f))]
        workers = max(1, min(jobs or os.cpu_count() or 1, len(units), 8))
        for f in ckpt.shards.values():
            job.progress(len(f.prefix))
        _run_units(job, units, workers)  # returns only once every worker has stopped
        job.check_sizes()
        if arm != "unconstrained":  # read the finished shards back while fsync waits for the disk
            out_hashes = mf.BackgroundHashes(tmp, only=set(ckpt.shards))
        job.sync()
        job.close()
        source_entries = source_hashes.result()
        digest = mf.digest_of(mf.render(source_entries))
        prov = None
        order = {lin: i for i, lin in enumerate(ckpt.quantized_linears)}
        result = ConvertResult(output=out, arm=arm, source=str(src), source_digest=digest,
                               layers=dict(sorted(job.stats.items(), key=lambda kv: order[kv[0]])), bytes_total=total)
        if arm != "unconstrained" or src_weights is not None:
            prov = provenance_for(arm, str(src), ckpt, None if source is None else str(source))
            result.provenance = prov
            if arm != "unconstrained":
                try:
                    _write_config(ckpt, tmp, prov)
                except OSError as exc:
                    raise OutputError(f"writing config.json failed: {_os_reason(exc)}", file=out / CONFIG) from exc
                _write_evidence(tmp, out, source_entries, out_hashes.result(), result)
        try:
            _fsync_tree(tmp, skip=set(ckpt.shards))
        except OSError as exc:
            raise OutputError(f"syncing the output failed: {_os_reason(exc)}", file=out) from exc
        if final.exists() or final.is_symlink():
            if not force:  # it appeared while we were converting: never replace it silently
                raise OutputError("appeared while converting; pass --force to replace it", file=out)
            old = final.parent / f".{final.name}.requant-old-{uuid.uuid4().hex[:12]}"
            try:
                os.rename(final, old)
            except OSError as exc:
                old = None
                raise OutputError(f"moving the existing output aside failed: {_os_reason(exc)}", file=out) from exc
        try:
            os.rename(tmp, final)
        except OSError as exc:
            raise OutputError(f"renaming the finished output into place failed: {_os_reason(exc)}", file=out) from exc
    except BaseException:
        for hashes in (source_hashes, out_hashes):
            if hashes is not None:
                hashes.cancel()
        job.close()  # safe: no worker is running any more (_run_units waited for them)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not (final.exists() or final.is_symlink()):
            os.rename(old, final)  # put the replaced output back
            old = None
        for d in created_parents:
            try:
                d.rmdir()
            except OSError:
                break
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
    try:
        for d in [final.parent] + [c.parent for c in created_parents]:
            _fsync_path(d)  # the renames (and any directories made for OUT) are durable
    except OSError as exc:
        raise OutputError(f"output written, but syncing its directory failed: {_os_reason(exc)}", file=out) from exc
    result.elapsed_s = time.perf_counter() - t0
    return result
