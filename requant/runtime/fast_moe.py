"""The fast engine's Qwen3-MoE sparse block: the reference engine's router and combine
(runtime/moe.py: `route`, `combine`, the same expert ids and weights, bit for bit), the experts
through the fast engine's kernels.

For each routed expert, in ascending id, on its tokens' rows in ascending order: the rows of the
post-attention RMSNorm's int8 quantization (per token, so a row's bits are those of quantizing it
alone: the reference engine's operands), the stacked gate/up GEMM, the fused SiLU-multiply-quantize,
the down GEMM; the combine adds fp32(y) * w per token in that order and rounds once. What differs
from the reference engine is what differs for a dense layer: the fused kernels' RMSNorm and SiLU
(kernels/emulation.py states them). Routing reads the routes on the host (torch.unique, nonzero):
an MoE model's decode steps run eagerly, never from a CUDA graph.
"""

from __future__ import annotations

import torch

from requant.kernels.fused_moe import VLLM_MOE
from requant.runtime.moe import combine, route

__all__ = ["expert_layout", "sparse_block"]


def expert_layout(model, i: int, stack) -> dict:
    """Layer i's router and experts: each expert's gate/up stacked along N (stack: fast._stack)."""
    lin, p = model.linears, f"model.layers.{i}.mlp."
    experts = []
    for e in range(model.arch.experts):
        ex = f"{p}experts.{e}."
        names = (ex + "gate_proj", ex + "up_proj")
        experts.append({"gu": stack(lin, list(names)), "down": lin[ex + "down_proj"], "names": names})
    return {"router": model.dense[p + "gate.weight"], "experts": experts}


def sparse_block(engine, moe: dict, h: torch.Tensor, q8: torch.Tensor, s8: torch.Tensor, mm) -> torch.Tensor:
    """bf16 [T, hidden] from the normed hidden states h and their quantization (q8, s8);
    mm(q, s, (w, s_w), names) is the engine's GEMM (it records the operands when capturing)."""
    m = engine.model
    if str(m.backend) == VLLM_MOE:  # its routed down epilogue and moe_sum live in the reference engine only
        raise ValueError(f"backend {VLLM_MOE} runs on the reference engine (engine='reference')")
    ids, weights = route(h, moe["router"], m.arch.top_k, m.arch.norm_topk_prob)

    def expert(e: int, rows, slots):
        ex = moe["experts"][e]
        gu = mm(q8[rows], s8[rows], ex["gu"], ex["names"])
        qm, sm = engine.ops.silu_mul_quantize(gu)
        return mm(qm, sm, ex["down"], (ex["names"][0].replace("gate_proj", "down_proj"),))

    return combine(ids, weights, h.shape[1], expert)
