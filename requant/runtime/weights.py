"""Loading a Qwen3 for the runtime: a W8A8 checkpoint (one regime of it) or a plain bf16
Qwen3 directory, checked first, then moved to one device.

Two dictionaries describe a loaded model:
  dense    {tensor name: bf16 tensor}: embeddings, norms, and every Linear that runs dense
           (`lm_head` when the checkpoint does not quantize it; every Linear of a bf16 model)
  linears  {module name: (int8 w [out, in], fp32 s_w [out, 1])}: the quantized Linears of one
           regime (requant.regime): native = the checkpoint's own scales; pow2 = the nearest arm,
           i.e. exactly what `requant convert --arm nearest` writes, made in memory.

A bf16 directory is recognised by a config.json without quantization_config; its tensors
are read with the safetensors library (model.safetensors or the shards that
model.safetensors.index.json names). Anything the runtime cannot run is a ValueError
naming the file and the tensor or field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from requant.checkpoint import check_qwen3
from requant.errors import TensorError
from requant.io.links import check_inside
from requant.models.qwen3 import Qwen3Arch
from requant.models.qwen3_moe import arch_of
from requant.regime import NATIVE, POW2, REGIMES, check_regime, pow2_weights

# REGIMES: requant.regime's, re-exported for requant.runtime.REGIMES
__all__ = [
    "REGIMES",
    "BF16",
    "LAYER_NORMS",
    "Bf16Dir",
    "arch_from_config",
    "check_layout",
    "dense_names",
    "load_bf16_dense",
    "load_dense",
    "load_linears",
]

BF16 = "bf16"  # the regime name of a bf16 model (every Linear dense)
LAYER_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)


def arch_from_config(config: dict, where: str = "config.json") -> Qwen3Arch:
    """Qwen3Arch.from_config (Qwen3MoeArch's for a Qwen3-MoE config) plus what a forward pass
    must also agree on: rope_theta from transformers 5's `rope_parameters` when the top-level key
    is absent (Qwen3Arch would fall back to 10000), and a refusal of what this runtime does not
    implement."""
    try:
        arch = arch_of(config)
    except ValueError as exc:  # its messages say "config.json": name the file itself
        msg = str(exc)
        raise ValueError(where + msg[len("config.json") :] if msg.startswith("config.json") else msg) from None
    rp = config.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ValueError(f"{where}: rope_parameters is not an object")
    if "rope_theta" not in config and "rope_theta" in rp:
        arch = dataclasses.replace(arch, rope_theta=float(rp["rope_theta"]))
    scaling = config.get("rope_scaling")
    for what in (rp, scaling):
        if what in (None, {}):
            continue
        kind = what.get("rope_type", what.get("type", "default")) if isinstance(what, dict) else what
        if kind != "default":
            raise ValueError(f"{where}: RoPE type {kind!r} is not supported by the runtime (plain RoPE only)")
    if config.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias=true is not supported by the runtime (Qwen3 has none)")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {config.get('hidden_act')!r} is not supported (Qwen3 uses silu)")
    if config.get("use_sliding_window"):
        raise ValueError(f"{where}: use_sliding_window=true is not supported by the runtime")
    if arch.heads % arch.kv_heads:
        raise ValueError(
            f"{where}: num_attention_heads {arch.heads} is not a multiple of num_key_value_heads {arch.kv_heads}"
        )
    return arch


def dense_names(config: dict, quantized: set[str]) -> list[str]:
    """Names of the non-quantized tensors the runtime reads from a W8A8 checkpoint."""
    sh = arch_of(config)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(sh.layers):
        names += [f"model.layers.{i}.{n}" for n in LAYER_NORMS]
    if "lm_head" not in quantized:
        names.append("lm_head.weight")
    return names


def _check_shapes(ckpt, sh: Qwen3Arch, known: dict, names: set) -> None:
    """Every decoder Linear's weight, and q_norm/k_norm, of the shape config.json implies
    (hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size): a
    head_dim that disagrees with the tensors is named here, not as a reshape error mid-run."""
    fields = (
        f"hidden_size {sh.hidden}, num_attention_heads {sh.heads}, num_key_value_heads {sh.kv_heads}, "
        f"head_dim {sh.head_dim}, intermediate_size {sh.intermediate}"
    )
    want = {f"{n}.weight": shape for n, shape in known.items()}
    for i in range(sh.layers):
        for norm in ("q_norm", "k_norm"):
            want[f"model.layers.{i}.self_attn.{norm}.weight"] = (sh.head_dim,)
    for tname, shape in want.items():
        if tname in names:
            got = tuple(ckpt.info(tname).shape)
            if got != tuple(shape):
                raise ValueError(
                    f"tensor {tname!r} is {list(got)}, but config.json ({fields}) gives {list(shape)}: "
                    "config.json does not describe these weights"
                )


def check_layout(ckpt) -> None:
    """Refuse, with a message, a W8A8 checkpoint this runtime cannot run: a config without
    the Qwen3 fields, a quantized module the runtime does not know, a missing dense tensor."""
    sh = arch_from_config(ckpt.config, str(Path(getattr(ckpt, "path", ".")) / "config.json"))
    known = sh.linear_shapes()
    names = set(ckpt.tensor_names())
    for n in ckpt.quantized_linears:
        if n != "lm_head" and n not in known:
            raise ValueError(
                f"quantized module {n!r} is not a Linear of a {sh.layers}-layer Qwen3 (the runtime knows q/k/v/o, gate/up/down, lm_head)"
            )
        if n.endswith(".mlp.gate"):
            raise ValueError(f"the router {n!r} is quantized; the runtime routes with the bf16 router weight only")
    quantized = set(ckpt.quantized_linears)
    for n in known:
        if n not in quantized and n + ".weight" not in names:
            raise ValueError(f"the checkpoint has no {n!r}: not a Qwen3 layout")
    _check_shapes(ckpt, sh, known, names)
    tie = bool(ckpt.config.get("tie_word_embeddings", False))
    for n in dense_names(ckpt.config, quantized):
        if n == "lm_head.weight" and tie:
            continue
        if n not in names and not (n == "lm_head.weight" and "model.embed_tokens.weight" in names):
            raise ValueError(f"the checkpoint has no tensor {n!r} (the runtime runs Qwen3: q_norm/k_norm per head)")


def _finite(ckpt, name: str, t: torch.Tensor | None = None) -> torch.Tensor:
    """One non-quantized tensor (`t`, already read, or read here), refused (TensorError naming its
    file and tensor) when it holds a NaN or an infinity: otherwise every activation downstream is
    NaN and the error surfaces far away, naming no file (a kernel's "activations contain NaN or
    infinity"). On a GPU tensor the check runs there (one host read)."""

    if t is None:
        t = ckpt.tensor(name)
    if t.is_floating_point():
        bad = ~torch.isfinite(t.reshape(-1))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            where = ckpt.shard_of(name).path if hasattr(ckpt, "shard_of") else getattr(ckpt, "path", None)
            raise TensorError(
                f"{float(t.reshape(-1)[i])!r} at flat index {i} ({int(bad.sum())} non-finite value(s) in all): "
                "a non-quantized tensor must be finite",
                file=where,
                tensor=name,
            )
    return t


def _dense_on(ckpt, name: str, device) -> torch.Tensor:
    """_finite's tensor on `device`. On CUDA read straight into page-locked memory, copied without
    blocking and checked on the GPU (the same bytes, the same refusal)."""
    if torch.device(device).type == "cuda" and hasattr(ckpt, "shard_of"):
        host = ckpt.shard_of(name).tensor_direct(name, pin=True)
        return _finite(ckpt, name, host.to(device, non_blocking=True))
    return _finite(ckpt, name).to(device)


def load_dense(ckpt, device) -> dict[str, torch.Tensor]:
    """The non-quantized tensors of a W8A8 checkpoint, on device (bf16 as stored), each checked
    finite as it is read (_finite); a tied lm_head reuses the embedding; a non-quantized decoder
    Linear (one the config's ignore list names) is read as a dense weight too."""
    quantized = set(ckpt.quantized_linears)
    tie = bool(ckpt.config.get("tie_word_embeddings", False))
    names = set(ckpt.tensor_names())
    dense = {}
    for n in dense_names(ckpt.config, quantized):
        if n == "lm_head.weight" and (tie or n not in names):
            continue
        dense[n] = _dense_on(ckpt, n, device)
    for n in arch_of(ckpt.config).linear_shapes():  # the MoE routers too
        if n not in quantized:
            dense[n + ".weight"] = _dense_on(ckpt, n + ".weight", device)
    if "lm_head" not in quantized and "lm_head.weight" not in dense:
        dense["lm_head.weight"] = dense["model.embed_tokens.weight"]
    return dense


def load_linears(ckpt, regime: str, device, threads: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every quantized Linear of one regime (requant.regime, checked by the caller): native = the
    checkpoint's scales; pow2 = requant.regime.pow2_weights, i.e. what `requant convert` writes,
    made on the CPU in a thread pool (torch releases the GIL; same bytes)."""
    names = list(ckpt.quantized_linears)

    def place(q, s):
        return q.to(device).contiguous(), s.to(torch.float32).reshape(-1, 1).to(device).contiguous()

    if regime == NATIVE:
        return {n: place(*ckpt.weight_and_scale(n)) for n in names}
    if regime != POW2:
        check_regime(regime)
    out = {}
    workers = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        # bounded: at most 2 * workers Linears read ahead of the one being placed
        pending = {}
        for n in names:
            pending[n] = pool.submit(pow2_weights, *ckpt.weight_and_scale(n))
            if len(pending) >= 2 * workers:
                first = next(iter(pending))
                out[first] = place(*pending.pop(first).result())
        for n, fut in pending.items():
            out[n] = place(*fut.result())
    return {n: out[n] for n in names}


# -- plain bf16 directories ------------------------------------------------------------


class Bf16Dir:
    """A plain (unquantized) Qwen3 safetensors directory, read with the safetensors library."""

    def __init__(self, path: Path, config: dict):
        self.path = path
        self.config = config
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        for f in (path / "config.json", index, single):  # no link out of the directory (requant.io.links)
            if f.is_symlink():
                check_inside(path, f)
        check_qwen3(config, path / "config.json")  # after the link rules: nothing read from outside first
        if index.is_file():
            try:
                wm = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise ValueError(f"{index}: not a shard index with a weight_map ({exc})") from None
            for shard in set(wm.values()):
                if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard in (".", ".."):
                    raise ValueError(f"{index}: shard name {shard!r} is not a plain file name")
                if not (path / shard).is_file():
                    raise ValueError(f"{index}: names shard {shard!r}, which does not exist")
                check_inside(path, path / shard)
            self.weight_map = dict(wm)
        elif single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                self.weight_map = {k: "model.safetensors" for k in f.keys()}
        else:
            raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")

    def tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.weight_map:
            raise ValueError(f"{self.path}: no tensor {name!r}")
        with safe_open(str(self.path / self.weight_map[name]), framework="pt") as f:
            return f.get_tensor(name)

    def tensor_names(self) -> list[str]:
        return sorted(self.weight_map)


def load_bf16_dense(bdir: Bf16Dir, device) -> dict[str, torch.Tensor]:
    """Every tensor a bf16 Qwen3 forward needs, checked (float dtype, Qwen3 shape) and
    converted to bf16 on device (an fp16/fp32 original is rounded to bf16 once)."""
    arch = arch_from_config(bdir.config, str(bdir.path / "config.json"))
    shapes = {n + ".weight": s for n, s in arch.linear_shapes().items()}
    shapes["model.embed_tokens.weight"] = (arch.vocab, arch.hidden)
    shapes["model.norm.weight"] = (arch.hidden,)
    for i in range(arch.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (arch.hidden,)
        shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (arch.head_dim,)
    have = set(bdir.weight_map)
    if "lm_head.weight" in have or not arch.tie:
        shapes["lm_head.weight"] = (arch.vocab, arch.hidden)
    dense = {}
    for n, shape in shapes.items():
        if n not in have:
            raise ValueError(f"{bdir.path}: no tensor {n!r} (not a Qwen3 bf16 checkpoint)")
        t = bdir.tensor(n)
        if not t.is_floating_point():
            raise ValueError(
                f"{bdir.path / bdir.weight_map[n]}: tensor {n!r} is {t.dtype}, expected a float dtype (a bf16 checkpoint)"
            )
        if tuple(t.shape) != tuple(shape):
            raise ValueError(
                f"{bdir.path / bdir.weight_map[n]}: tensor {n!r} has shape {list(t.shape)}, expected {list(shape)}"
            )
        dense[n] = t.to(torch.bfloat16).to(device)
    if "lm_head.weight" not in dense:
        dense["lm_head.weight"] = dense["model.embed_tokens.weight"]
    return dense
