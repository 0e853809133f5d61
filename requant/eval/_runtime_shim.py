"""TEMPORARY adapter: the subset of the shared runtime API (`requant.runtime`) that eval uses.

DELETE THIS FILE when `requant.runtime` lands: requant/eval/model.py imports
`requant.runtime.load_model` first and falls back to this module only while that import
fails, so nothing else changes at integration.

It implements, on top of today's audit runtime (audit/runtime.py: `Qwen3W8A8`, `load_dense`,
`load_linears`, `check_layout`) and audit/capture.py (`tokenizer_for`):
  load_model(src, regime, backend, act_backend, device) -> model with
    .config, .arch, .max_length, .tokenizer (encode, decode, describe, eos_id),
    .logits(list of id lists) -> list of fp32 [T_i, vocab],
    .greedy(list of id lists, max_new_tokens, eos_id) -> list of new id lists
  and a plain bf16 Qwen3 directory (no quantization_config) with every Linear dense.
Greedy decoding re-runs the whole prefill for every new token (no KV cache): correct and
slow, enough for tests. The audit runtime packs prompts into one pass with a T x T
block-diagonal mask, so `logits` packs prompts only up to PACK_TOKENS tokens per pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from requant import kernels
from requant.audit.capture import tokenizer_for
from requant.audit.runtime import Qwen3W8A8, check_layout, load_dense, load_linears
from requant.qwen3 import LAYER_LINEARS, Qwen3Arch

PACK_TOKENS = 512  # packing is quadratic in the T x T mask: 4 x 512 packed cost as much as one 2048 alone


class _Model(Qwen3W8A8):
    """The audit runtime with the activation quantizer chosen by name."""

    def __init__(self, config, dense, linears, act_backend: str):
        super().__init__(config, dense, linears)
        self.act_backend = act_backend

    def _linear(self, x, names, backend, capture):
        outs = []
        quantized = [n for n in names if n in self.linears]
        if quantized:
            q, s = kernels.quantize_activations(x, backend=self.act_backend)
        for n in names:
            if n in self.linears:
                w, s_w = self.linears[n]
                outs.append(kernels.scaled_mm(q, w, s, s_w, backend=backend))
            else:
                if n not in self._fp32:
                    self._fp32[n] = self.dense[n + ".weight"].to(torch.float32)
                outs.append((x.to(torch.float32) @ self._fp32[n].T).to(torch.bfloat16))
        return outs


class _Tokenizer:
    def __init__(self, path: Path | None, vocab: int):
        self._encode, self.kind = tokenizer_for(path, vocab)
        self.vocab_size = vocab
        self._tok = None
        self._sha = None
        self.eos_id = None
        if path is not None and self.kind == "tokenizer.json":
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            self._sha = hashlib.sha256((Path(path) / "tokenizer.json").read_bytes()).hexdigest()
        if path is not None:
            gen = Path(path) / "generation_config.json"
            tcfg = Path(path) / "tokenizer_config.json"
            if gen.is_file():
                e = json.loads(gen.read_text()).get("eos_token_id")
                self.eos_id = e[0] if isinstance(e, list) and e else e
            elif tcfg.is_file() and self._tok is not None:
                e = json.loads(tcfg.read_text()).get("eos_token")
                e = e.get("content") if isinstance(e, dict) else e
                self.eos_id = self._tok.token_to_id(e) if isinstance(e, str) else None

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            return self._tok.decode(list(ids))
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return {"kind": self.kind, "sha256": self._sha, "vocab_size": self.vocab_size}


class ShimModel:
    def __init__(self, config: dict, net: _Model, tokenizer: _Tokenizer, backend: str, device: str):
        self.config = config
        self.arch = Qwen3Arch.from_config(config)
        self.max_length = int(config.get("max_position_embeddings") or 2048)
        self.tokenizer = tokenizer
        self._net = net
        self._backend = backend
        self._device = torch.device(device)

    def logits(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        group: list[list[int]] = []

        def flush():
            if group:
                with torch.no_grad():
                    packed = self._net.forward([torch.tensor(p, dtype=torch.long, device=self._device) for p in group], self._backend)
                out.extend(torch.split(packed, [len(p) for p in group]))
                group.clear()

        for p in prompts:
            if not p:
                raise ValueError("an empty prompt has no logits")
            if group and sum(map(len, group)) + len(p) > PACK_TOKENS:
                flush()
            group.append(list(p))
        flush()
        return out

    def greedy(self, prompts: list[list[int]], max_new_tokens: int = 64, eos_id: int | None = None) -> list[list[int]]:
        new: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for _ in range(max_new_tokens):
            if not live:
                break
            logits = self.logits([list(prompts[i]) + new[i] for i in live])
            still = []
            for i, lg in zip(live, logits):
                t = int(torch.argmax(lg[-1]))
                new[i].append(t)
                if eos_id is None or t != eos_id:
                    still.append(i)
            live = still
        return new


def _load_plain_bf16(path: Path, device: str) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(path / f), device=str(device)))
    sh = Qwen3Arch.from_config(config)
    needed = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{n}" for i in range(sh.layers) for n in
        ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        + [leaf + ".weight" for leaf in LAYER_LINEARS]]
    for n in needed:
        if n not in tensors:
            raise ValueError(f"{path}: the bf16 checkpoint has no tensor {n!r}")
    if "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    return config, tensors


def load_model(src, regime: str = "native", backend: str = "reference-triton-order", act_backend: str = "reference",
               device: str = "cpu") -> ShimModel:
    if regime not in ("native", "pow2"):
        raise ValueError(f"unknown regime {regime!r}")
    if backend not in kernels.scaled_mm_backends():
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}")
    path = Path(getattr(src, "path", src))
    config_path = path / "config.json"
    if path.is_dir() and config_path.is_file() and "quantization_config" not in json.loads(config_path.read_text()):
        config, dense = _load_plain_bf16(path, device)
        linears: dict = {}
    else:
        from requant.checkpoint import open_checkpoint

        ckpt = src if hasattr(src, "quantized_linears") else open_checkpoint(src)
        check_layout(ckpt)
        config, path = ckpt.config, ckpt.path
        dense = load_dense(ckpt, device)
        linears = load_linears(ckpt, regime, device)
    net = _Model(config, dense, linears, act_backend)
    vocab = int(config["vocab_size"])
    return ShimModel(config, net, _Tokenizer(path, vocab), backend, device)
