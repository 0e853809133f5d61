"""`requant convert`: rewrite a W8A8 checkpoint's weight scales under one arm, safely.

  __init__    convert(): validate, stream the segments, record the provenance, publish atomically
  _streaming  the units of work: shards streamed piece by piece into output shards
  _workers    a bounded thread pool in file order, with a deterministic failure
  replace     what --force may replace: OUT not inside SRC, nothing a user wrote into an old OUT

Imports checkpoint, scales, evidence, io and errors; nothing above it.

How, and why this way: docs/checkpoints.md#output (validate first, stream, in parallel, provenance,
atomically), docs/checkpoints.md#reading-and-writing-the-decisions.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import requant
from requant.checkpoint import SKIP_DIRS, open_checkpoint
from requant.convert import _streaming as streaming
from requant.convert.replace import check_output, refuse_users_files
from requant.errors import CheckpointError, OutputError, os_reason
from requant.evidence import manifest as mf
from requant.evidence import provenance
from requant.evidence.origin import open_source_weights, proof_bytes, prove_origin
from requant.evidence.provenance import PROVENANCE_KEY
from requant.io.inputs import load_json
from requant.io.links import shown
from requant.io.output import AtomicOutput, OutputInterrupted, json_bytes, write_bytes_atomic
from requant.io.space import check_room
from requant.scales import ARMS, SERVABLE
from requant.scales.requantizer import LinearStats

__all__ = ["convert", "file_states", "ConvertResult", "PROVENANCE_KEY", "CONVERT_REPORT"]

MAX_WORKERS = 8
CONVERT_REPORT = "requant-convert.json"


@dataclass
class ConvertResult:
    output: Path
    arm: str
    source: str
    layers: dict[str, LinearStats] = field(default_factory=dict)  # in model order
    provenance: dict | None = None
    source_digest: str = ""  # the source's manifest digest (sha256 of SHA256SUMS.source's bytes)
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
            "servable": SERVABLE[self.arm],
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


def _write_evidence(tmp: Path, out: Path, shard_entries: dict[str, mf.Entry], result: ConvertResult) -> None:
    """SHA256SUMS of everything in tmp (the shards hashed already, read back while they
    were being synced; config.json, SHA256SUMS.source and the rest now), then the
    statistics (requant-convert.json, not covered: it quotes the digest). Sets
    result.manifest_digest."""
    try:
        data = mf.render(mf.compute(tmp, known=shard_entries, pin=False))
        write_bytes_atomic(tmp / mf.MANIFEST, data)
        result.manifest_digest = mf.digest_of(data)
        report = {k: v for k, v in result.to_dict().items() if k not in ("output", "elapsed_s")}  # deterministic
        (tmp / CONVERT_REPORT).write_bytes(json_bytes(report, indent=1))  # standard JSON: no NaN literal
    except OSError as exc:
        raise OutputError(f"writing the manifests failed: {os_reason(exc)}", file=out) from exc


def file_states(ckpt) -> dict[str, tuple]:
    """(device, inode, size, mtime_ns, ctime_ns) of every file of SRC, taken before its bytes are
    read for conversion or hashing. The headers and config.json were read just before: they are
    read again now and must be what was parsed, so the window between is closed too."""
    states = {}
    for rel, p in mf.walk_files(ckpt.path).items():
        st = os.stat(p)
        states[rel] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    for name, f in ckpt.shards.items():
        with open(f.path, "rb") as fh:
            if fh.read(len(f.prefix)) != f.prefix:
                raise _changed(ckpt, name)
    if load_json(ckpt.path / "config.json", what="config.json") != ckpt.config:
        raise _changed(ckpt, "config.json")
    return states


def _changed(ckpt, rel: str) -> CheckpointError:
    return CheckpointError(
        "changed while it was being converted; nothing was written (the bytes hashed might not be the "
        "bytes converted): run again once nothing writes to the source",
        file=shown(ckpt.path / rel),
    )


def _check_unchanged(ckpt, before: dict[str, tuple]) -> None:
    """CheckpointError naming the first file of SRC that was replaced, resized, rewritten, added
    or removed since file_states: SHA256SUMS.source then records what was converted."""
    try:
        after = file_states(ckpt)
    except OSError:
        after = {}
    for rel in sorted(set(before) | set(after)):
        if before.get(rel) != after.get(rel):
            raise _changed(ckpt, rel)


def convert(
    src: str | os.PathLike,
    output: str | os.PathLike,
    arm: str = "nearest",
    *,
    force: bool = False,
    revision: str | None = None,
    source: str | os.PathLike | None = None,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    src_entries: dict[str, mf.Entry] | None = None,
    src_states: dict[str, tuple] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Convert SRC into OUTPUT under `arm`, atomically. Raises CheckpointError on bad input or output.

    Args:
        src: a W8A8 checkpoint directory or Hub repo id (compressed-tensors int-quantized).
        output: the directory to create; never inside SRC, replaced only with force.
        arm: unconstrained | nearest | ceiling | mse | probe (requant.scales.arms.ARMS).
        force: replace an existing OUTPUT.
        revision: the Hub revision when SRC is a repo id.
        source: the original bf16 weights to requantize from (their origin is proven first).
        jobs: worker threads (default: CPU count, at most 8).
        progress: called with each batch of bytes processed (from worker threads).
        on_start: called once with the total bytes before work begins (with `source`, the
            total includes the bytes the origin proof reads).
        src_entries: the manifest entries of SRC's directory when the caller has just hashed
            it (requant eval converts one checkpoint into every arm); otherwise SRC is hashed
            in background threads. They must name exactly SRC's files (checked by listing).
        src_states: file_states(SRC) taken before src_entries were hashed, so that a source
            changed between that hashing and the end of this conversion is refused too.
        on_note: hears about what dead runs left beside OUTPUT (removed, or left alone and
            named: requant.io.output.sweep_stale); a RuntimeWarning by default.

    SRC's own SHA256SUMS, when it has one, must list exactly its files (checked before any
    work) with their bytes (checked once they are hashed, before the rename): a mismatch is a
    ManifestError and nothing is written, as audit, eval, determinism, card and push refuse it.
    An interrupt once OUTPUT is complete is a requant.io.output.OutputInterrupted saying so.

    Returns:
        ConvertResult: per-layer statistics, the output path, bytes and time.
    """
    if arm not in ARMS:
        raise CheckpointError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    t0 = time.perf_counter()
    ckpt = open_checkpoint(src, revision=revision)
    out = Path(output)
    check_output(ckpt.path, out, force)
    src_weights = None
    total = sum(f.file_size for f in ckpt.shards.values())
    if source is not None:
        src_weights = open_source_weights(source, ckpt)
        check_output(Path(source), out, force)
        if on_start:
            on_start(total + proof_bytes(src_weights, ckpt))
        prove_origin(src_weights, ckpt, progress=progress)  # before anything is written
    elif on_start:
        on_start(total)

    if src_entries is not None and set(src_entries) != set(mf.covered_files(ckpt.path)):
        raise CheckpointError("the given source hashes do not name the checkpoint's files", file=ckpt.path)
    stored = mf.read(ckpt.path)  # SRC's own SHA256SUMS: its files must be the ones it lists
    if stored is not None:  # the listing now, before any work; the bytes once they are hashed, before the rename
        mf.check_against(ckpt.path, stored)
    check_room(out, sum(p.stat().st_size for p in mf.walk_files(ckpt.path, SKIP_DIRS).values()), str(out))
    constrained = arm != "unconstrained"
    # every source byte is read after this (or after src_states, when src_entries were hashed earlier)
    before = src_states if src_states is not None else file_states(ckpt)
    keep_users_files = lambda final: refuse_users_files(out, final, ckpt.path)  # noqa: E731
    with AtomicOutput(out, force, on_note, keep_users_files) as dest:
        source_hashes = shard_hashes = None
        try:
            if src_entries is None:  # plain sha256 of every source file, beside the units
                source_hashes = mf.BackgroundHashes(ckpt.path)
            job = streaming.Job(ckpt, dest.tmp, out, arm, src_weights, progress)
            try:
                try:
                    streaming.copy_other_files(ckpt, dest.tmp, out, arm)
                except OutputError:
                    # A source file listed and then gone (a writer's temporary file renamed over a
                    # shard, say) fails its copy: the source changing is the cause, and says so.
                    _check_unchanged(ckpt, before)
                    raise
                job.create_outputs()
                units = [(name, seg) for name, f in ckpt.shards.items() for seg in streaming.segments(f)]
                workers = max(1, min(jobs or os.cpu_count() or 1, len(units), MAX_WORKERS))
                for f in ckpt.shards.values():
                    job.progress(len(f.prefix))
                streaming.run(job, units, workers)  # returns only once every worker has stopped
                job.check_sizes()
                if constrained:  # read the finished shards back while fsync waits for the disk
                    shard_hashes = mf.BackgroundHashes(dest.tmp, only=set(ckpt.shards), pin=False)
                job.sync()
            finally:
                job.close()  # safe: no worker is running any more
            entries = src_entries if source_hashes is None else source_hashes.result()
            _check_unchanged(ckpt, before)  # the hashes and the conversion read the same bytes
            if stored is not None:
                mf.check_against(ckpt.path, stored, entries)
            digest, prov = provenance.record(
                ckpt,
                dest.tmp,
                out,
                arm=arm,
                src_label=str(src),
                source_dir=None if source is None else str(source),
                source_entries=entries,
            )
            order = {lin: i for i, lin in enumerate(ckpt.quantized_linears)}
            result = ConvertResult(
                output=out,
                arm=arm,
                source=str(src),
                provenance=prov,
                source_digest=digest,
                layers=dict(sorted(job.stats.items(), key=lambda kv: order[kv[0]])),
                bytes_total=total,
            )
            if constrained:
                _write_evidence(dest.tmp, out, shard_hashes.result(), result)
        except BaseException:
            for hashes in (source_hashes, shard_hashes):  # before the temporary output is removed
                if hashes is not None:
                    hashes.cancel()
            raise
        dest.commit(synced=set(ckpt.shards))
    try:
        result.elapsed_s = time.perf_counter() - t0
    except KeyboardInterrupt:
        raise OutputInterrupted(out) from None
    return result
