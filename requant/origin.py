"""--source: a checkpoint's original float weights (SourceWeights, open_source_weights)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from requant.checkpoint import Checkpoint, read_weight_files
from requant.errors import LayoutError, TensorError
from requant.safetensors_io import SafetensorsFile

FLOAT_DTYPES = ("BF16", "F16", "F32")


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
            raise TensorError(f"source weight stored as {info.dtype}, expected a float dtype", file=f.path, tensor=wname)
        if info.shape != want:
            raise TensorError(f"source weight shape {list(info.shape)} does not match the checkpoint's {list(want)}", file=f.path, tensor=wname)
    return sw
