"""`requant inspect`: what a checkpoint is, in one summary a person or a script can read.

Answers the questions asked before converting or serving a checkpoint: which
architecture and shape, how many quantized Linears, in which scale dtype, whether every
scale is already a power of two (i.e. whether it was converted, and by which arm: the
"requant" provenance key), and the range the int8 weights actually use (-128 appears in
llm-compressor output). Reading the int8 range touches every weight once, one Linear at a
time, so memory stays bounded by the largest weight.
"""

from __future__ import annotations

import os

import numpy as np

from requant.checkpoint import Checkpoint, open_checkpoint
from requant.evidence.provenance import PROVENANCE_KEY
from requant.io.safetensors_io import pread_exact
from requant.kernels.bf16 import is_power_of_two
from requant.models.qwen3 import SIZE_KEYS
from requant.models.qwen3_moe import MOE_KEYS
from requant.scales.arms import ceil_exponent

CONFIG_KEYS = (*SIZE_KEYS, "tie_word_embeddings", "torch_dtype", *MOE_KEYS)  # MoE keys: shown when present


def _int8_range(ckpt: Checkpoint, name: str, buf: bytearray) -> tuple[int, int, int]:
    """(min, max, count of -128) of one int8 tensor, read in pieces into a reused buffer."""
    f = ckpt.shard_of(name)
    info = f.info(name)
    lo, hi, n128 = 127, -128, 0
    fd = os.open(f.path, os.O_RDONLY)
    try:
        for pos in range(0, info.nbytes, len(buf)):
            n = min(len(buf), info.nbytes - pos)
            view = memoryview(buf)[:n]
            pread_exact(fd, view, f.data_start + info.begin + pos, file=f.path, tensor=name)
            a = np.frombuffer(view, dtype=np.int8)
            lo, hi = min(lo, int(a.min())), max(hi, int(a.max()))
            n128 += int(np.count_nonzero(a == -128))
            del a
            view.release()
    finally:
        os.close(fd)
    return lo, hi, n128


def summarize(ckpt: Checkpoint, *, weights: bool = True) -> dict:
    buf = bytearray(1 << 20)
    cfg = ckpt.config
    scale_dtypes: dict[str, int] = {}
    pow2 = channels = 0
    qmin, qmax = 127, -128
    n_min128 = 0
    exps_min, exps_max = None, None
    for lin in ckpt.quantized_linears:
        sname = lin + ".weight_scale"
        info = ckpt.info(sname)
        scale_dtypes[info.dtype] = scale_dtypes.get(info.dtype, 0) + 1
        s = ckpt.tensor(sname)
        pow2 += int(is_power_of_two(s).sum())
        channels += s.numel()
        e = ceil_exponent(s)
        lo, hi = int(e.min()), int(e.max())
        exps_min = lo if exps_min is None else min(exps_min, lo)
        exps_max = hi if exps_max is None else max(exps_max, hi)
        if weights:
            lo, hi, n128 = _int8_range(ckpt, lin + ".weight", buf)
            qmin, qmax, n_min128 = min(qmin, lo), max(qmax, hi), n_min128 + n128
    quant_tensors = {lin + suffix for lin in ckpt.quantized_linears for suffix in (".weight", ".weight_scale")}
    passthrough = [n for n in ckpt.tensor_names() if n not in quant_tensors]
    out = {
        "path": str(ckpt.path),
        "architecture": (cfg.get("architectures") or [None])[0],
        "model_type": cfg.get("model_type"),
        "config": {k: cfg.get(k) for k in CONFIG_KEYS if k in cfg},
        "layers": cfg.get("num_hidden_layers"),
        "quantized_linears": len(ckpt.quantized_linears),
        "quantization": {
            "quant_method": cfg["quantization_config"].get("quant_method"),
            "format": cfg["quantization_config"].get("format"),
            "ignore": list(ckpt.scheme.ignore),
        },
        "scale_dtypes": scale_dtypes,
        "channels": channels,
        "power_of_two_scales": pow2,
        "all_scales_power_of_two": channels > 0 and pow2 == channels,
        "scale_exponent_range": [exps_min, exps_max] if exps_min is not None else None,
        "passthrough_tensors": len(passthrough),
        "shards": {name: f.file_size for name, f in ckpt.shards.items()},
        "bytes": sum(f.file_size for f in ckpt.shards.values()),
        "provenance": cfg.get(PROVENANCE_KEY),
    }
    if cfg.get("model_type") == "qwen3_moe":
        out["moe"] = _moe_summary(ckpt)
    if weights:
        out["int8_range"] = [qmin, qmax] if ckpt.quantized_linears else None
        out["int8_min128_count"] = n_min128
    return out


def _moe_summary(ckpt: Checkpoint) -> dict:
    """The experts at a glance: sparse layers, quantized expert Linears, how the routers are stored."""
    from requant.models.qwen3_moe import Qwen3MoeArch

    arch = Qwen3MoeArch.from_config(ckpt.config)
    routers = arch.routers()
    quantized = set(ckpt.quantized_linears)
    stored = sorted({"int8" if r in quantized else ckpt.info(r + ".weight").dtype for r in routers})
    return {
        "sparse_layers": len(routers),
        "experts": arch.experts,
        "experts_per_token": arch.top_k,
        "expert_linears": sum(".mlp.experts." in n for n in ckpt.quantized_linears),
        "routers": stored,
    }


def inspect_checkpoint(src: str | os.PathLike, *, revision: str | None = None, weights: bool = True) -> dict:
    return summarize(open_checkpoint(src, revision=revision), weights=weights)
