"""The Qwen3-MoE presets of the synthetic generator (requant.checkpoint.synthetic) and their plan.

The same RTN arithmetic and draws as the dense presets (synthetic._tensors_for): every expert
Linear is a quantized Linear like any other, the router `mlp.gate` a bf16 tensor drawn like
the embeddings, left unquantized by the config's ignore list (lm_head and 're:.*mlp.gate$', as
llm-compressor's MoE recipes write it).

Presets (config values from the published configs; sources in docs/moe.md):
  tiny-moe         CI: 2 layers (layer 0 dense through mlp_only_layers), 8 experts, top 2, hidden 256,
                   (moe_)intermediate_size 768, norm_topk_prob, byte-level vocabulary 512 (like `tiny`).
  qwen3-30b-a3b    Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads / 4 KV heads, head_dim
                   128, 128 experts, top 8, moe_intermediate_size 768, vocab 151936 (~31 GB W8A8).
  qwen3-235b-a22b  Qwen/Qwen3-235B-A22B: 94 layers, hidden 4096, 64 / 4 heads, 128 experts, top 8,
                   moe_intermediate_size 1536 (~236 GB W8A8): for `plan_summary` estimates only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from requant.models.qwen3_moe import ARCHITECTURE, EXPERT_LEAVES, MODEL_TYPE, ROUTER, Qwen3MoeArch

# The ignore list llm-compressor's MoE examples pass (the router stays bf16).
MOE_IGNORE = ("lm_head", "re:.*mlp.gate$")


@dataclass(frozen=True)
class MoePreset(Qwen3MoeArch):
    """A Qwen3-MoE architecture plus what only a generated config.json needs."""

    max_position: int
    bos: int
    eos: int


_Q3 = dict(max_position=40960, bos=151643, eos=151645)
_TINY = dict(experts=8, top_k=2, moe_intermediate=768, norm_topk_prob=True, mlp_only_layers=(0,))
MOE_PRESETS: dict[str, MoePreset] = {
    # hidden 256 and intermediate 768 like `tiny`: every K spans several of F6's 64-wide tiles (a K of
    # one tile or two lets F6 stay within one spacing at M = 1, which the matrix does not predict)
    "tiny-moe": MoePreset(256, 768, 2, 4, 2, 64, 512, False, 2048, 256, 257, **_TINY),
    "qwen3-30b-a3b": MoePreset(
        2048,
        6144,
        48,
        32,
        4,
        128,
        151936,
        False,
        **_Q3,
        experts=128,
        top_k=8,
        moe_intermediate=768,
        norm_topk_prob=True,
    ),
    "qwen3-235b-a22b": MoePreset(
        4096,
        12288,
        94,
        64,
        4,
        128,
        151936,
        False,
        **_Q3,
        experts=128,
        top_k=8,
        moe_intermediate=1536,
        norm_topk_prob=True,
    ),
}


def moe_plan(p: Qwen3MoeArch) -> list[tuple[str, str, tuple[int, ...]]]:
    """(module-or-tensor name, kind, shape) in model order; kind: embed, norm, linear, router, head."""
    out: list[tuple[str, str, tuple[int, ...]]] = [("model.embed_tokens.weight", "embed", (p.vocab, p.hidden))]
    for i in range(p.layers):
        pre = f"model.layers.{i}."
        out.append((pre + "input_layernorm.weight", "norm", (p.hidden,)))
        shapes = p.layer_shapes(i)
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
            out.append((pre + n, "linear", shapes[n]))
        out.append((pre + "self_attn.q_norm.weight", "norm", (p.head_dim,)))
        out.append((pre + "self_attn.k_norm.weight", "norm", (p.head_dim,)))
        out.append((pre + "post_attention_layernorm.weight", "norm", (p.hidden,)))
        for n, shape in list(shapes.items())[4:]:
            if n == ROUTER:
                out.append((pre + n + ".weight", "router", shape))
            else:
                out.append((pre + n, "linear", shape))
    out.append(("model.norm.weight", "norm", (p.hidden,)))
    if not p.tie:
        out.append(("lm_head.weight", "head", (p.vocab, p.hidden)))
    return out


def moe_config_fields(p: Qwen3MoeArch) -> dict:
    """The config.json keys an MoE model adds to (or changes in) the dense ones."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "decoder_sparse_step": p.sparse_step,
        "mlp_only_layers": list(p.mlp_only_layers),
        "moe_intermediate_size": p.moe_intermediate,
        "norm_topk_prob": p.norm_topk_prob,
        "num_experts": p.experts,
        "num_experts_per_tok": p.top_k,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }


def plan_summary(p: Qwen3MoeArch) -> dict:
    """What a W8A8 checkpoint of this architecture holds, from the shapes alone (nothing written):
    bytes (W8A8 and bf16), quantized Linears (of which expert Linears), the largest layer's bytes
    (what a layer-by-layer pass must hold at once), and the active expert weights per token."""
    entries = moe_plan(p)
    q_bytes = b_bytes = linears = expert_linears = 0
    per_layer: dict[int, int] = {}
    for name, kind, shape in entries:
        n = math.prod(shape)
        q = n + 2 * shape[0] if kind == "linear" else 2 * n
        q_bytes += q
        b_bytes += 2 * n
        if kind == "linear":
            linears += 1
            expert_linears += ".experts." in name
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            per_layer[i] = per_layer.get(i, 0) + q
    active = sum(math.prod(s) for s in p.expert_shapes().values()) * p.top_k
    return {
        "layers": p.layers,
        "moe_layers": len(p.moe_layers()),
        "experts": p.experts,
        "top_k": p.top_k,
        "quantized_linears": linears,
        "expert_linears": expert_linears,
        "w8a8_bytes": q_bytes,
        "bf16_bytes": b_bytes,
        "largest_layer_bytes": max(per_layer.values()),
        "active_expert_weights_per_token_per_layer": active,
        "expert_leaves": list(EXPERT_LEAVES),
    }
