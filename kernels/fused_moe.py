"""vLLM's int8 fused-MoE arithmetic (the Triton `fused_moe_kernel` with use_int8_w8a8 and per-channel
weight scales, then `moe_sum`), emulated in torch: the backend `reference-vllm-moe-order`.

Read from vLLM's source (docs/moe.md, "vLLM's int8 fused-MoE kernel", cites the commit):
  gate/up GEMM (MUL_ROUTED_WEIGHT off): y = bf16(fp32(fp32(acc) * s_a) * s_w): the Triton order.
  down GEMM (MUL_ROUTED_WEIGHT on), one (token, slot) row with router weight r (fp32):
      z = bf16(fp32(fp32(fp32(acc) * r) * s_a) * s_w)            one rounding to bf16, at the end
  combine: out[t] = moe_sum over the token's top-k slots in rank order:
      k <= 4: x = 0; x = bf16(x + z_slot) per slot (bf16 arithmetic, one rounding per add)
      k > 4:  at::sum_out: an fp32 sum of the k bf16 values, rounded once (the slot order of that
              fp32 sum is torch's CUDA reduction's; emulated here in slot order: see docs/moe.md).
acc is the exact int32 dot (the kernel adds each K block's int32 dot to an fp32 accumulator: exact
while every partial sum stays within 2**24, always so for K <= 1032, e.g. every down projection of
Qwen3-30B-A3B, K = 768).

As a scaled_mm backend (no routed weight: every Linear that is not an expert's down projection) it
is the Triton order; the routed down projection and the combine need the route, an operand the
scaled_mm signature has not: `down_vllm` and `moe_sum_vllm` take it, and the reference engine's
sparse block (runtime/moe.py) calls them when the model's backend is this one.
"""

from __future__ import annotations

import torch

from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.reference import accumulate, check_operands, epilogue_triton_order

__all__ = ["VLLM_MOE", "MOE_SUM_BF16_MAX_K", "scaled_mm_vllm_moe", "down_vllm", "moe_sum_vllm"]

VLLM_MOE = "reference-vllm-moe-order"
# moe_sum's bf16 kernel is instantiated for top-k 2, 3 and 4 (1 is a copy); wider falls back to at::sum_out.
MOE_SUM_BF16_MAX_K = 4


def scaled_mm_vllm_moe(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """The fused-MoE kernel without a routed weight (gate/up): bf16(fp32(s_a * fp32(acc)) * s_w)."""
    check_operands(a, w, s_a, s_w)
    return epilogue_triton_order(accumulate(a, w), s_a, s_w)


def down_vllm(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N]: the routed down projection's epilogue, bf16(((fp32(acc) * r) * s_a) * s_w), left to
    right in fp32 (acc int32 [M, N], s_a and route fp32 [M, 1], s_w fp32 [N, 1])."""
    x = acc.to(torch.float32) * route.reshape(-1, 1).to(torch.float32)
    x = x * s_a.reshape(-1, 1)
    return round_fp32_to_bf16(x * s_w.reshape(1, -1))


def moe_sum_vllm(z: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] from the slot outputs z bf16 [T, k, N] (rank order): moe_sum (module docstring)."""
    k = z.shape[1]
    if k > MOE_SUM_BF16_MAX_K:
        acc = torch.zeros(z.shape[0], z.shape[2], dtype=torch.float32, device=z.device)
        for j in range(k):
            acc = acc + z[:, j].to(torch.float32)
        return round_fp32_to_bf16(acc)
    x = torch.zeros(z.shape[0], z.shape[2], dtype=torch.bfloat16, device=z.device)
    for j in range(k):  # bf16 + bf16: the exact sum (in fp32) rounded once to bf16, per add
        x = round_fp32_to_bf16(x.to(torch.float32) + z[:, j].to(torch.float32))
    return x
