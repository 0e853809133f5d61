"""--source: a checkpoint's original float weights, and the proof that they are its origin.

Why a proof. `requant convert CKPT --source BF16` makes every quantized Linear from the
bf16 weights and passes everything else through from CKPT. That is only right when CKPT
was made from BF16 by plain RTN. llm-compressor's usual W8A8 recipe is SmoothQuant + GPTQ:
smoothing divides the Linears' input columns by a per-channel vector and folds it into
the preceding norms, and GPTQ's error feedback moves int8 weights away from RTN. From such
a checkpoint, --source would write RTN-of-unsmoothed Linears beside smoothed norms: a
broken model. So, before anything is written, `prove_origin` checks, tensor by tensor in
model order, and names the first tensor that disagrees and why (a TensorError naming the
checkpoint's shard and the tensor, and the source file); the checks, in order:
docs/checkpoints.md#from-the-bf16-source---source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from requant.checkpoint import Checkpoint, read_weight_files
from requant.errors import LayoutError, TensorError, os_reason
from requant.io.safetensors_io import DTYPES, SafetensorsFile, TensorInfo, pread_exact
from requant.scales.from_source import rtn_at_scale, rtn_scale

CHUNK = 1 << 20  # bytes per piece of a pass-through comparison
BLOCK_BYTES = 1 << 20  # int8 bytes per block of rows of a Linear
FLOAT_DTYPES = ("BF16", "F16", "F32")
INSTEAD = "requantize from its int8 weights instead (drop --source)"
# Tensors that smoothing (SmoothQuant) rewrites outside the quantized Linears.
_NORM_SUFFIXES = ("norm.weight", "layernorm.weight")


class SourceWeights:
    """The original float weights of a checkpoint (for --source), read on demand."""

    def __init__(self, path: Path, shards: dict[str, SafetensorsFile], weight_map: dict[str, str]):
        self.path, self.shards, self.weight_map = path, shards, weight_map

    def shard_of(self, name: str) -> SafetensorsFile:
        return self.shards[self.weight_map[name]]

    def tensor(self, name: str) -> torch.Tensor:
        return self.shard_of(name).tensor(name)


def open_source_weights(src: str | os.PathLike, ckpt: Checkpoint) -> SourceWeights:
    """Open a directory of original (bf16/fp16/fp32) weights (the same layout rules as a
    checkpoint's: requant.checkpoint.read_weight_files) and check that it holds a float
    `X.weight` of the right shape for every quantized Linear X of ckpt."""
    path = Path(src)
    if not path.is_dir():
        raise LayoutError("source weights: not a directory", file=path)
    shards, weight_map, _ = read_weight_files(path, what="source weights: ")
    sw = SourceWeights(path, shards, weight_map)
    for lin in ckpt.quantized_linears:
        wname = lin + ".weight"
        if wname not in weight_map:
            raise TensorError("source weights lack this Linear's weight", file=path, tensor=wname)
        f = sw.shard_of(wname)
        info = f.info(wname)
        want = ckpt.info(wname).shape
        if info.dtype not in FLOAT_DTYPES:
            raise TensorError(
                f"source weight stored as {info.dtype}, expected a float dtype", file=f.path, tensor=wname
            )
        if info.shape != want:
            raise TensorError(
                f"source weight shape {list(info.shape)} does not match the checkpoint's {list(want)}",
                file=f.path,
                tensor=wname,
            )
    return sw


def proof_bytes(sw: SourceWeights, ckpt: Checkpoint) -> int:
    """Bytes that prove_origin reads (for a progress bar): every checkpoint tensor but the
    scales, and its counterpart in the source."""
    scales = {lin + ".weight_scale" for lin in ckpt.quantized_linears}
    total = 0
    for name in ckpt.weight_map:
        if name not in scales:
            total += ckpt.info(name).nbytes + (sw.shard_of(name).info(name).nbytes if name in sw.weight_map else 0)
    return total


class _Files:
    """Read-only fds of the shards being compared, opened once each."""

    def __init__(self) -> None:
        self.fds: dict[Path, int] = {}

    def fd(self, path: Path) -> int:
        if path not in self.fds:
            try:
                self.fds[path] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise TensorError(f"opening failed: {os_reason(exc)}", file=path) from exc
        return self.fds[path]

    def read(self, f: SafetensorsFile, info: TensorInfo, pos: int, view: memoryview) -> None:
        pread_exact(self.fd(f.path), view, f.data_start + info.begin + pos, file=f.path, tensor=info.name)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _value(raw: bytes, dtype: str):
    return torch.frombuffer(bytearray(raw), dtype=DTYPES[dtype][0]).item()


def _check_passthrough(files: _Files, ckpt: Checkpoint, sw: SourceWeights, name: str, progress) -> None:
    cf = ckpt.shard_of(name)
    ci = cf.info(name)
    if name not in sw.weight_map:
        raise TensorError(
            f"not in the source weights ({sw.path}): a source holds every tensor that the checkpoint passes "
            f"through, so this is not the checkpoint's origin; {INSTEAD}",
            file=cf.path,
            tensor=name,
        )
    sf = sw.shard_of(name)
    si = sf.info(name)
    if (ci.dtype, ci.shape) != (si.dtype, si.shape):
        raise TensorError(
            f"is {ci.dtype} {list(ci.shape)} here but {si.dtype} {list(si.shape)} in the source ({sf.path}): "
            f"not the checkpoint's origin; {INSTEAD}",
            file=cf.path,
            tensor=name,
        )
    a, b = bytearray(min(CHUNK, ci.nbytes)), bytearray(min(CHUNK, ci.nbytes))
    for pos in range(0, ci.nbytes, CHUNK):
        n = min(CHUNK, ci.nbytes - pos)
        va, vb = memoryview(a)[:n], memoryview(b)[:n]
        files.read(cf, ci, pos, va)
        files.read(sf, si, pos, vb)
        progress(2 * n)
        na, nb = np.frombuffer(va, np.uint8), np.frombuffer(vb, np.uint8)
        if not np.array_equal(na, nb):  # (a memoryview comparison goes element by element: ~10x slower)
            item = DTYPES[ci.dtype][1]
            first = pos + int(np.flatnonzero(na != nb)[0])
            k = first // item  # pieces start at multiples of CHUNK, which every item size divides
            off = k * item - pos
            here, there = _value(va[off : off + item], ci.dtype), _value(vb[off : off + item], ci.dtype)
            why = (
                "the checkpoint was smoothed (SmoothQuant?)"
                if name.endswith(_NORM_SUFFIXES)
                else "the source is not the checkpoint's origin"
            )
            raise TensorError(
                f"differs from the source ({sf.path}) at element {k} ({here!r} here, {there!r} in the source): "
                f"{why}; {INSTEAD}",
                file=cf.path,
                tensor=name,
            )


def _check_linear(files: _Files, ckpt: Checkpoint, sw: SourceWeights, lin: str, progress) -> None:
    wname, sname = lin + ".weight", lin + ".weight_scale"
    qf, sf = ckpt.shard_of(wname), sw.shard_of(wname)
    qi, si = qf.info(wname), sf.info(wname)
    scale_file = ckpt.shard_of(sname)
    scale = scale_file.tensor(sname)  # [out, 1], validated: finite and positive
    wdt = si.torch_dtype
    rows, cols = qi.shape
    item = DTYPES[si.dtype][1]
    step = max(1, BLOCK_BYTES // cols)
    qbuf, wbuf = bytearray(min(step, rows) * cols), bytearray(min(step, rows) * cols * item)
    sbits = torch.int16 if scale.element_size() == 2 else torch.int32
    first_diff, n_diff = None, 0
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        qv, wv = memoryview(qbuf)[: n * cols], memoryview(wbuf)[: n * cols * item]
        files.read(qf, qi, r0 * cols, qv)
        files.read(sf, si, r0 * cols * item, wv)
        progress(len(qv) + len(wv))
        q = torch.frombuffer(qv, dtype=torch.int8).reshape(n, cols)
        w = torch.frombuffer(wv, dtype=wdt).reshape(n, cols)
        s_ck = scale[r0 : r0 + n]
        s_rtn = rtn_scale(w, allow_zero=True).to(scale.dtype)
        bad = (s_rtn.view(sbits) != s_ck.view(sbits)).reshape(-1)
        if bool(bad.any()):
            r = int(bad.nonzero()[0, 0])
            zero = " (an all-zero row, which RTN cannot quantize)" if float(s_rtn[r, 0]) == 0 else ""
            raise TensorError(
                f"is not the RTN scale of the source weight ({sf.path}): output channel {r0 + r} is "
                f"{float(s_ck[r, 0])!r} here, absmax/127.5 of the source is {float(s_rtn[r, 0])!r}{zero}; the "
                f"checkpoint was not made from these weights by RTN (smoothed, or another observer?); {INSTEAD}",
                file=scale_file.path,
                tensor=sname,
            )
        q_rtn = rtn_at_scale(w, s_ck.to(wdt))
        if torch.equal(q_rtn, q):  # the common case, and far cheaper than counting
            continue
        diff = q_rtn != q
        k = int(diff.sum())
        if k:
            if first_diff is None:
                r, c = divmod(int(diff.reshape(-1).nonzero()[0, 0]), cols)
                first_diff = (r0 + r, c, int(q[r, c]), int(q_rtn[r, c]))
            n_diff += k
    if first_diff is not None:
        r, c, here, rtn = first_diff
        raise TensorError(
            f"int8 weights are not RTN of the source at the checkpoint's scale (GPTQ?): first difference "
            f"at [{r}, {c}], {here} here, RTN gives {rtn} ({n_diff} of {rows * cols} weights differ; source "
            f"{sf.path}); {INSTEAD}",
            file=qf.path,
            tensor=wname,
        )


def prove_origin(sw: SourceWeights, ckpt: Checkpoint, progress: Callable[[int], None] | None = None) -> None:
    """Prove that `sw` produced `ckpt` by RTN (see the module docstring), or raise a
    TensorError naming the first tensor, in model order, that disagrees and why."""
    progress = progress or (lambda n: None)
    linears = set(ckpt.quantized_linears)
    scales = {lin + ".weight_scale" for lin in linears}
    files = _Files()
    try:
        for name in ckpt.tensor_names():  # model order: a Linear's weight just before its scale
            if name in scales:
                continue  # checked with its weight
            if name.endswith(".weight") and name[: -len(".weight")] in linears:
                _check_linear(files, ckpt, sw, name[: -len(".weight")], progress)
            else:
                _check_passthrough(files, ckpt, sw, name, progress)
    finally:
        files.close()
