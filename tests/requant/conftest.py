"""Shared fixtures: small checkpoints written under tmp_path (never anywhere else)."""

import shutil
from pathlib import Path

import pytest

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint.synthetic import Preset, generate

# A micro Qwen3 (every Linear dimension a multiple of 16), fast enough for every test.
MICRO = Preset(
    hidden=32,
    intermediate=64,
    layers=2,
    heads=2,
    kv_heads=1,
    head_dim=16,
    vocab=64,
    tie=False,
    max_position=128,
    bos=1,
    eos=2,
)


@pytest.fixture
def default_copy(tmp_path) -> Path:
    """A private copy of the embedded default checkpoint."""
    dst = tmp_path / "default"
    shutil.copytree(DEFAULT_CHECKPOINT, dst)
    return dst


@pytest.fixture
def micro(tmp_path) -> Path:
    return generate(MICRO, tmp_path / "micro", seed=1)


@pytest.fixture
def micro_sharded(tmp_path) -> Path:
    # ~6 KB per layer of int8 weights: a 4 KB limit gives several shards
    return generate(MICRO, tmp_path / "micro_sharded", seed=1, shard_size=4096)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(parent: Path, name: str) -> list[str]:
    """Entries next to an output that a failed convert might have left (OUT or temp dirs)."""
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))


def load_all(path: Path) -> dict:
    """All tensors of one .safetensors file. Reference reader: safetensors.torch.load_file."""
    from safetensors.torch import load_file

    # clone: load_file maps the file, and tests rewrite files they have read
    return {k: v.clone() for k, v in load_file(str(path)).items()}


def write_custom(
    path: Path,
    tensors: dict,
    header_order: list[str],
    data_order: list[str],
    metadata=None,
    metadata_last=False,
    pad: int = 0,
    indent=None,
) -> None:
    """A valid safetensors file that the library would never write: header keys in one
    order, data in another, __metadata__ anywhere, arbitrary space padding."""
    import json
    import math

    from requant.io.safetensors_io import TORCH_TO_ST, tensor_to_bytes

    offsets, pos = {}, 0
    for n in data_order:
        t = tensors[n]
        nb = math.prod(t.shape) * t.element_size()
        offsets[n] = (pos, pos + nb)
        pos += nb
    header = {}
    if metadata is not None and not metadata_last:
        header["__metadata__"] = metadata
    for n in header_order:
        t = tensors[n]
        header[n] = {"dtype": TORCH_TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": list(offsets[n])}
    if metadata is not None and metadata_last:
        header["__metadata__"] = metadata
    raw = json.dumps(header, indent=indent).encode() + b" " * pad
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for n in data_order:
            f.write(tensor_to_bytes(tensors[n]))
