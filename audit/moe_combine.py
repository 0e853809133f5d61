"""Qwen3-MoE: each sparse block's routed down projections and combine, compared between the two
backends on the same captured operands (the JSON's `moe_combine`).

Why a row beside the per-Linear ones: vLLM's int8 fused-MoE kernel (reference-vllm-moe-order,
kernels/fused_moe.py) multiplies the router weight into the down GEMM's fp32 accumulator and sums the
top-k slots with moe_sum, whereas the other backends' pipeline is the reference engine's (runtime/
moe.py): each expert's output rounded to bf16, weighted and added in fp32 in ascending expert id,
rounded once. A per-Linear row compares one GEMM without its routed weight, which vLLM never runs
for a down projection; this row compares what each backend makes of a block's output, per token.

Operands: each expert's down_proj int8 activations and scales as the prefill captured them (the
first backend's pass), the expert's weights, and the block's route (ids, weights [T, k]); rows of an
expert are its tokens in ascending order, as the sparse block ran them.
"""

from __future__ import annotations

import torch

from requant import kernels
from requant.audit.compare import compare_layer
from requant.kernels.epilogue import int_mm
from requant.kernels.fused_moe import VLLM_MOE, down_vllm, moe_sum_vllm
from requant.runtime.moe import combine

__all__ = ["block_output", "combine_rows"]


def block_output(backend: str, block: str, ids, weights, ops: dict, linears: dict) -> torch.Tensor:
    """bf16 [T, hidden]: the block's combined down projections under `backend` (module docstring)."""
    vllm = str(backend) == VLLM_MOE
    hidden = linears[f"{block}.experts.{int(ids[0, 0])}.down_proj"][0].shape[0]
    z = torch.zeros(*ids.shape, hidden, dtype=torch.bfloat16, device=ids.device)

    def expert(e: int, rows, slots):
        name = f"{block}.experts.{e}.down_proj"
        act, (w, s_w) = ops[name], linears[name]
        if not vllm:
            return kernels.scaled_mm(act.a, w, act.s_a, s_w, backend=backend)
        z[rows, slots] = down_vllm(int_mm(act.a, w), act.s_a, s_w, weights[rows, slots])
        return None

    out = combine(ids, weights, hidden, expert)  # the reference combine (runtime/moe.py); vLLM's: z
    return moe_sum_vllm(z) if vllm else out


def combine_rows(regime: str, routes: dict, ops: dict, linears: dict, backends) -> list[dict]:
    """One row per sparse block (name "<block> (down + combine)"; m = tokens, k = the experts'
    intermediate width, n = hidden), in the per_layer rows' format."""
    rows = []
    for block, (ids, weights) in routes.items():
        if ids.shape[0] == 0:
            continue
        a, b = (block_output(be, block, ids, weights, ops, linears) for be in backends)
        k = ops[f"{block}.experts.{int(ids[0, 0])}.down_proj"].a.shape[1]
        rows.append(compare_layer(f"{block} (down + combine)", regime, a, b, (ids.shape[0], k, a.shape[1])))
    return rows


def e2e_claimed(backends, model) -> bool:
    """Whether the prediction matrix's end-to-end claim (C7) covers this run: not for a pair with
    reference-vllm-moe-order on a Qwen3-MoE model, whose blocks combine the experts in an arithmetic
    other than the reference engine's whatever the scales (docs/moe.md): the matrix predicts GEMM
    epilogue orders, and that difference is reported by the moe_combine rows instead."""
    return not (VLLM_MOE in map(str, backends) and getattr(model.arch, "experts", 0) > 0)


E2E_NOTE = "no matrix claim: reference-vllm-moe-order combines an MoE block's experts otherwise (moe_combine)"
