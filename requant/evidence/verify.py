"""`requant verify A B`: are two checkpoints the same bytes, and if not, where do they differ?

The byte-level question is the one that matters for reproducibility (the unconstrained
round trip, a regenerated default, a conversion repeated on another machine), so the
answer is "identical" only when every file under both directories is byte-identical.
Otherwise the report lists the files present on one side only, the files that differ,
and, for the weights, what differs tensor by tensor (matched by tensor name across
shards, so a re-sharded checkpoint is still compared tensor by tensor): missing tensors,
dtype/shape changes, and how many elements differ. Neither side needs to be a valid
W8A8 checkpoint; only files ending in .safetensors are parsed (with the strict reader).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from requant.checkpoint import SKIP_DIRS
from requant.errors import CheckpointError, LayoutError
from requant.evidence.manifest import READ_BYTES, walk_files
from requant.io import snapshot
from requant.io.safetensors_io import SafetensorsFile, read_header


def _files(root: Path) -> dict[str, Path]:
    # the manifest's file rules (links out of the checkpoint, symlinked directories and
    # dangling links refused), with the directories a checkpoint never includes left out
    return walk_files(root, SKIP_DIRS)


def _tensors(files: dict[str, Path]) -> tuple[dict[str, tuple[SafetensorsFile, str]], list[str]]:
    tensors, errors = {}, []
    for rel, p in sorted(files.items()):
        if not rel.endswith(".safetensors"):
            continue
        try:
            f = read_header(p)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        for name in f.tensors:
            tensors[name] = (f, rel)
    return tensors, errors


def _same_file(a: Path, b: Path) -> bool:
    """Byte equality of two files, each read through one descriptor pinned before and checked
    after (requant.io.snapshot: a side that changes meanwhile is an InputChanged, never a verdict)."""
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        sa, sb = os.fstat(fa.fileno()), os.fstat(fb.fileno())
        snapshot.pin(a, sa)
        snapshot.pin(b, sb)
        same = sa.st_size == sb.st_size
        while same:
            x, y = fa.read(READ_BYTES), fb.read(READ_BYTES)
            same = x == y
            if not x:
                break
        for f, st, p in ((fa, sa, a), (fb, sb, b)):
            if snapshot.key(os.fstat(f.fileno())) != snapshot.key(st):
                raise snapshot.InputChanged(str(p))
    return same


def verify(a: str | os.PathLike, b: str | os.PathLike) -> dict:
    """Compare two directories. Returns a report; report["identical"] is the verdict."""
    a, b = Path(a), Path(b)
    for p in (a, b):
        if not p.is_dir():
            raise LayoutError("not a directory", file=p)
    fa, fb = _files(a), _files(b)
    only_a = sorted(set(fa) - set(fb))
    only_b = sorted(set(fb) - set(fa))
    differing = sorted(rel for rel in set(fa) & set(fb) if not _same_file(fa[rel], fb[rel]))
    report = {
        "a": str(a),
        "b": str(b),
        "identical": not (only_a or only_b or differing),
        "only_in_a": only_a,
        "only_in_b": only_b,
        "differing_files": differing,
        "tensors": [],
        "errors": [],
    }
    if report["identical"]:
        snapshot.check()  # one consistent snapshot of each side: neither changed since it was compared
        return report
    ta, ea = _tensors(fa)
    tb, eb = _tensors(fb)
    identical_files = (set(fa) & set(fb)) - set(differing)
    report["errors"] = ea + eb
    diffs = []
    for name in sorted(set(ta) | set(tb)):
        if name not in tb:
            diffs.append({"tensor": name, "what": "only in A", "file_a": ta[name][1]})
            continue
        if name not in ta:
            diffs.append({"tensor": name, "what": "only in B", "file_b": tb[name][1]})
            continue
        (sa, ra), (sb, rb) = ta[name], tb[name]
        ia, ib = sa.info(name), sb.info(name)
        entry = {"tensor": name, "file_a": ra, "file_b": rb}
        if ia.dtype != ib.dtype or ia.shape != ib.shape:
            entry.update(what="dtype/shape", a=f"{ia.dtype}{list(ia.shape)}", b=f"{ib.dtype}{list(ib.shape)}")
            diffs.append(entry)
            continue
        if ra == rb and ra in identical_files:
            continue  # same file, compared byte for byte above: its tensors are identical
        xa, xb = sa.read_bytes(name), sb.read_bytes(name)
        if xa == xb:
            continue
        ta_, tb_ = torch.frombuffer(xa, dtype=torch.uint8), torch.frombuffer(xb, dtype=torch.uint8)
        size = max(ia.nbytes // max(ia.numel, 1), 1)
        neq = (ta_.reshape(-1, size) != tb_.reshape(-1, size)).any(dim=1)
        entry.update(
            what="values", elements_differing=int(neq.sum()), elements=ia.numel, first_index=int(neq.nonzero()[0, 0])
        )
        diffs.append(entry)
    report["tensors"] = diffs
    if not diffs and not report["errors"]:
        # same tensors, different files: sharding, headers (order, metadata, padding) or other files
        report["note"] = "tensor data identical; the difference is in sharding, headers or non-tensor files"
    snapshot.check()
    return report
