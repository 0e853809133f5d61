"""A small Qwen3 W8A8 runtime of our own, in plain torch, device-agnostic.

Why our own and not transformers: the audit needs exactly one thing from a model, the
operands each quantized Linear sees on real prompts, and it needs every quantized Linear
to go through `kernels/` by name (so that CUTLASS, Triton or a reference emulation does the
GEMM). A hundred lines of torch do that with no dependency and no monkey-patching.

What it computes (prefill only, no KV cache; prompts packed into one pass with a
block-diagonal causal mask, positions restarting per prompt):
  embeddings -> L x [RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual]
  -> final RMSNorm -> lm_head
  attention: q/k/v projections, Qwen3's per-head RMSNorm on q and k (q_norm, k_norm), RoPE
  (rope_theta, rotate-half convention), grouped-query attention with a causal mask, softmax
  in fp32, o projection.
Activations are bf16 between ops; norms, RoPE, attention scores, softmax and SiLU*up run in
fp32 with one cast back to bf16. That is close to, but not bit-identical with, transformers'
bf16 Qwen3 (which applies RoPE and the score matmul in bf16): the audit needs realistic
operands, not transformers' exact activations. Every quantized Linear is
    (q, s) = kernels.quantize_activations(x, backend="reference")   # shared int8 operands
    y      = kernels.scaled_mm(q, w, s, s_w, backend=NAME)           # bf16
and a capture hook, when given, records (q, s) per Linear. Linears that the checkpoint does
not quantize (usually lm_head) run as bf16 weights with an fp32 matmul.
"""

from __future__ import annotations

import torch

from requant import kernels
from requant.qwen3 import Qwen3Arch

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(torch.float32) * xf.to(x.dtype).to(torch.float32)).to(x.dtype)


def rope(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate-half RoPE on [T, H, D] (positions default to 0..T-1), in fp32, cast back."""
    t, _, d = x.shape
    if positions is None:
        positions = torch.arange(t, device=x.device)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    xf = x.to(torch.float32)
    rot = torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


class Qwen3W8A8:
    """One regime's model: dense bf16 tensors (shared between regimes) + that regime's
    quantized Linears {name: (int8 w [out, in], fp32 s_w [out, 1])}, all on one device."""

    def __init__(self, config: dict, dense: dict[str, torch.Tensor], linears: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        if config.get("attention_bias"):
            raise ValueError("attention_bias=true is not supported by the audit runtime (Qwen3 has none)")
        self.shape = Qwen3Arch.from_config(config)
        self.dense = dense
        self.linears = linears
        self._fp32: dict[str, torch.Tensor] = {}

    def _linear(self, x: torch.Tensor, names: tuple[str, ...], backend: str, capture) -> list[torch.Tensor]:
        """Apply Linears that share one input; quantize that input once (shared operands)."""
        outs = []
        quantized = [n for n in names if n in self.linears]
        if quantized:
            q, s = kernels.quantize_activations(x, backend="reference")
            if capture is not None:
                capture.record(tuple(quantized), q, s)
        for n in names:
            if n in self.linears:
                w, s_w = self.linears[n]
                outs.append(kernels.scaled_mm(q, w, s, s_w, backend=backend))
            else:
                if n not in self._fp32:
                    self._fp32[n] = self.dense[n + ".weight"].to(torch.float32)
                outs.append((x.to(torch.float32) @ self._fp32[n].T).to(torch.bfloat16))
        return outs

    def forward(self, prompts: list[torch.Tensor], backend: str, capture=None) -> torch.Tensor:
        """Logits [sum T, vocab] (fp32 of the bf16 result) for prompts of token ids, packed.

        The prompts are concatenated along the token axis: every Linear, norm and MLP acts
        per token, so packing changes nothing there, and attention is restricted to each
        prompt by a block-diagonal causal mask, with positions restarting at 0 per prompt.
        Packing gives every GEMM the same M (the total token count) that the per-layer
        cells use, so a GPU backend compiles/tunes one configuration per shape, not one
        per prompt length.
        """
        sh, d = self.shape, self.dense
        ids = torch.cat(prompts)
        dev = ids.device
        seg = torch.cat([torch.full((len(p),), i, dtype=torch.long, device=dev) for i, p in enumerate(prompts)])
        pos = torch.cat([torch.arange(len(p), device=dev) for p in prompts])
        idx = torch.arange(len(ids), device=dev)
        mask = (seg[:, None] != seg[None, :]) | (idx[None, :] > idx[:, None])  # True = masked
        x = d["model.embed_tokens.weight"][ids].to(torch.bfloat16)
        t = x.shape[0]
        group = sh.heads // sh.kv_heads
        for i in range(sh.layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, d[p + "input_layernorm.weight"], sh.eps)
            q, k, v = self._linear(h, (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"), backend, capture)
            q = rope(rms_norm(q.view(t, sh.heads, sh.head_dim), d[p + "self_attn.q_norm.weight"], sh.eps), sh.rope_theta, pos)
            k = rope(rms_norm(k.view(t, sh.kv_heads, sh.head_dim), d[p + "self_attn.k_norm.weight"], sh.eps), sh.rope_theta, pos)
            v = v.view(t, sh.kv_heads, sh.head_dim)
            qh = q.transpose(0, 1).to(torch.float32)  # [H, T, D]
            kh = k.transpose(0, 1).to(torch.float32).repeat_interleave(group, dim=0)
            vh = v.transpose(0, 1).to(torch.float32).repeat_interleave(group, dim=0)
            scores = (qh @ kh.transpose(1, 2)) * (sh.head_dim ** -0.5)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(torch.bfloat16).to(torch.float32)
            attn = (probs @ vh).to(torch.bfloat16).transpose(0, 1).reshape(t, sh.heads * sh.head_dim)
            (o,) = self._linear(attn, (p + "self_attn.o_proj",), backend, capture)
            x = x + o
            h = rms_norm(x, d[p + "post_attention_layernorm.weight"], sh.eps)
            gate, up = self._linear(h, (p + "mlp.gate_proj", p + "mlp.up_proj"), backend, capture)
            act = (torch.nn.functional.silu(gate.to(torch.float32)) * up.to(torch.float32)).to(torch.bfloat16)
            (down,) = self._linear(act, (p + "mlp.down_proj",), backend, capture)
            x = x + down
        x = rms_norm(x, d["model.norm.weight"], sh.eps)
        (logits,) = self._linear(x, ("lm_head",), backend, capture)
        return logits.to(torch.float32)


def dense_names(config: dict, quantized: set[str]) -> list[str]:
    """Names of the non-quantized tensors the runtime reads."""
    sh = Qwen3Arch.from_config(config)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(sh.layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    if "lm_head" not in quantized:
        names.append("lm_head.weight")
    return names


def check_layout(ckpt) -> None:
    """Refuse, with a message, a checkpoint this runtime cannot run: a config without the
    Qwen3 fields, a quantized module the runtime does not know, a missing dense tensor."""
    sh = Qwen3Arch.from_config(ckpt.config)
    if ckpt.config.get("attention_bias"):
        raise ValueError("attention_bias=true is not supported by the audit runtime (Qwen3 has none)")
    known = sh.linear_shapes()
    names = set(ckpt.tensor_names())
    for n in ckpt.quantized_linears:
        if n != "lm_head" and n not in known:
            raise ValueError(f"quantized module {n!r} is not a Linear of a {sh.layers}-layer Qwen3 (the audit runtime knows q/k/v/o, gate/up/down, lm_head)")
    quantized = set(ckpt.quantized_linears)
    for n in known:
        if n not in quantized and n + ".weight" not in names:
            raise ValueError(f"the checkpoint has no {n!r}: not a Qwen3 layout")
    tie = bool(ckpt.config.get("tie_word_embeddings", False))
    for n in dense_names(ckpt.config, quantized):
        if n == "lm_head.weight" and tie:
            continue
        if n not in names and not (n == "lm_head.weight" and "model.embed_tokens.weight" in names):
            raise ValueError(f"the checkpoint has no tensor {n!r} (the audit runtime runs Qwen3: q_norm/k_norm per head)")


def load_dense(ckpt, device: str | torch.device) -> dict[str, torch.Tensor]:
    """The non-quantized tensors, on device; a tied lm_head reuses the embedding."""
    quantized = set(ckpt.quantized_linears)
    tie = bool(ckpt.config.get("tie_word_embeddings", False))
    names = set(ckpt.tensor_names())
    dense = {}
    for n in dense_names(ckpt.config, quantized):
        if n == "lm_head.weight" and (tie or n not in names):
            continue
        dense[n] = ckpt.tensor(n).to(device)
    if "lm_head" not in quantized and "lm_head.weight" not in dense:
        dense["lm_head.weight"] = dense["model.embed_tokens.weight"]
    return dense


def load_linears(ckpt, regime: str, device: str | torch.device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every quantized Linear of one regime: native = the checkpoint's scales; pow2 = the
    converter's nearest arm (requant.arms.requantize), i.e. what `requant convert` writes."""
    out = {}
    requantize = None
    if regime == "pow2":
        from requant.arms import requantize
    elif regime != "native":
        raise ValueError(f"unknown regime {regime!r}")
    for name in ckpt.quantized_linears:
        q, s = ckpt.weight_and_scale(name)
        if requantize is not None:
            q, s = requantize(q, s, "nearest")
        out[name] = (q.to(device).contiguous(), s.to(torch.float32).reshape(-1, 1).to(device).contiguous())
    return out
