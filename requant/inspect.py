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

import torch

from requant.arms import ceil_exponent
from requant.checkpoint import Checkpoint, open_checkpoint
from requant.convert import PROVENANCE_KEY

CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "tie_word_embeddings", "torch_dtype")


def is_power_of_two(s: torch.Tensor) -> torch.Tensor:
    """Elementwise, exact (frexp mantissa 0.5); same rule as kernels.bf16.is_power_of_two."""
    m, _ = torch.frexp(s.detach().to(torch.float64))
    return torch.isfinite(s.to(torch.float64)) & (s.to(torch.float64) > 0) & (m == 0.5)


def summarize(ckpt: Checkpoint, *, weights: bool = True) -> dict:
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
            q = ckpt.tensor(lin + ".weight")
            if q.numel():
                qmin, qmax = min(qmin, int(q.min())), max(qmax, int(q.max()))
                n_min128 += int((q == -128).sum())
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
    if weights:
        out["int8_range"] = [qmin, qmax] if ckpt.quantized_linears else None
        out["int8_min128_count"] = n_min128
    return out


def inspect_checkpoint(src: str | os.PathLike, *, revision: str | None = None, weights: bool = True) -> dict:
    return summarize(open_checkpoint(src, revision=revision), weights=weights)
