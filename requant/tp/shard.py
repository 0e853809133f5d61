"""Which part of a Qwen3 each tensor-parallel rank holds, and the slicing of the weights.

    p = plan(arch, tp=4, rank=1)                 # ValueError when tp does not fit the model
    dense, linears = shard(dense, linears, arch, p)

Layout (Megatron's): every rank holds the whole embedding, every norm weight and the whole
residual stream; the Linears are split.
  column-parallel (output rows split, the input replicated): q_proj, k_proj, v_proj by
    attention head, gate_proj and up_proj by intermediate channel, lm_head by vocabulary row.
  row-parallel (input columns split): o_proj by attention head, down_proj by intermediate
    channel; the partial results are summed across ranks (requant.tp.engine).
Heads: rank r runs query heads [r*H/tp, (r+1)*H/tp) and the KV heads they read; tp must divide
the KV heads or be a multiple of them (then a KV head is replicated). Any other tp is refused.

Why the slices are exact, and the KV-head rule in full: docs/tensor-parallel.md#layout-requanttpshardpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from requant.models.qwen3 import Qwen3Arch
from requant.models.qwen3_moe import Qwen3MoeArch

__all__ = ["Plan", "as_dense", "check_degree", "plan", "shard"]

COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class Plan:
    """Rank `rank` of `tp`: half-open index ranges it holds along each split axis."""

    tp: int
    rank: int
    heads: tuple[int, int]  # query heads
    kv_heads: tuple[int, int]  # KV heads (may be shared with other ranks)
    inter: tuple[int, int]  # intermediate channels
    vocab: tuple[int, int]  # lm_head rows

    @property
    def local_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def local_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def check_degree(arch: Qwen3Arch, tp: int) -> None:
    """ValueError (naming the config fields) unless tp can shard this model."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel degree must be a positive integer, got {tp!r}")
    if isinstance(arch, Qwen3MoeArch):
        raise ValueError("tensor parallelism runs dense Qwen3 only, not a Qwen3-MoE model (docs/moe.md)")
    what = (
        f"num_attention_heads {arch.heads}, num_key_value_heads {arch.kv_heads}, intermediate_size "
        f"{arch.intermediate}, vocab_size {arch.vocab}"
    )
    if arch.heads % tp or arch.intermediate % tp or arch.vocab % tp:
        raise ValueError(
            f"tp {tp} does not divide the model ({what}): it must divide the attention heads, "
            "the intermediate size and the vocabulary"
        )
    if arch.kv_heads % tp and tp % arch.kv_heads:
        raise ValueError(
            f"tp {tp} neither divides num_key_value_heads {arch.kv_heads} nor is a multiple of it ({what})"
        )


def plan(arch: Qwen3Arch, tp: int, rank: int) -> Plan:
    check_degree(arch, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside 0..{tp - 1}")

    def part(n: int) -> tuple[int, int]:
        step = n // tp
        return rank * step, (rank + 1) * step

    if arch.kv_heads % tp == 0:
        kv = part(arch.kv_heads)
    else:
        j = rank // (tp // arch.kv_heads)
        kv = (j, j + 1)
    return Plan(tp, rank, part(arch.heads), kv, part(arch.intermediate), part(arch.vocab))


def _rows(name: str, arch: Qwen3Arch, p: Plan) -> tuple[int, int] | None:
    """Output rows of a column-parallel Linear this rank holds; None for a row-parallel one."""
    d = arch.head_dim
    if name == "lm_head":
        return p.vocab
    leaf = name.split(".", 3)[-1]
    if leaf == "self_attn.q_proj":
        return p.heads[0] * d, p.heads[1] * d
    if leaf in ("self_attn.k_proj", "self_attn.v_proj"):
        return p.kv_heads[0] * d, p.kv_heads[1] * d
    if leaf in ("mlp.gate_proj", "mlp.up_proj"):
        return p.inter
    if leaf in ROW:
        return None
    raise ValueError(f"{name!r} is not a Qwen3 Linear")


def _cols(name: str, arch: Qwen3Arch, p: Plan) -> tuple[int, int]:
    """Input columns of a row-parallel Linear this rank holds."""
    if name.endswith("self_attn.o_proj"):
        return p.heads[0] * arch.head_dim, p.heads[1] * arch.head_dim
    return p.inter


def shard(
    dense: dict[str, torch.Tensor], linears: dict[str, tuple[torch.Tensor, torch.Tensor]], arch: Qwen3Arch, p: Plan
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """This rank's tensors (contiguous copies; the inputs are not modified). dense: the
    runtime's {tensor name: bf16} (requant.runtime.load_dense), linears: {module: (int8 w,
    fp32 s_w [N, 1])} (requant.runtime.load_linears). Replicated tensors are shared."""
    out_dense: dict[str, torch.Tensor] = {}
    for key, t in dense.items():
        module = key[: -len(".weight")] if key.endswith(".weight") else None
        if module is None or module in ("model.embed_tokens", "model.norm") or "layernorm" in key or "_norm" in key:
            out_dense[key] = t
            continue
        rows = _rows(module, arch, p)
        # a dense row-parallel Linear stays whole: the engine gathers its input instead (an
        # fp32 partial-sum all-reduce would not be exact)
        out_dense[key] = t if rows is None else t[rows[0] : rows[1]].contiguous()
    out_lin: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, (w, s_w) in linears.items():
        rows = _rows(name, arch, p)
        if rows is None:
            c0, c1 = _cols(name, arch, p)
            out_lin[name] = (w[:, c0:c1].contiguous(), s_w)
        else:
            out_lin[name] = (w[rows[0] : rows[1]].contiguous(), s_w[rows[0] : rows[1]].contiguous())
    return out_dense, out_lin


def as_dense(
    dense: dict[str, torch.Tensor], linears: dict[str, tuple[torch.Tensor, torch.Tensor]], names: tuple[str, ...]
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """The model with the quantized Linears `names` turned into dense bf16 Linears
    (bf16(fp32(w) * s_w), their dequantized weights), as a checkpoint that leaves them
    unquantized would hold them: what-ifs and the tests of the dense paths. New dicts; the
    inputs are not modified. KeyError names a Linear that is not quantized."""
    d, lin = dict(dense), dict(linears)
    for n in names:
        if n not in lin:
            raise KeyError(f"{n!r} is not a quantized Linear of this model")
        w, s_w = lin.pop(n)
        d[n + ".weight"] = (w.to(torch.float32) * s_w).to(torch.bfloat16)
    return d, lin
