"""What both engines (and tensor parallelism) share: the KV cache, the result of `generate`,
and the one rule that sizes a generation's cache.

`new_cache(batch, capacity)` holds exactly `capacity` positions; `generate` asks for
`generation_capacity(longest)` = the power of two at or above prompt + new tokens, so that a
few cache sizes (and, on the fast engine, a few CUDA graphs) serve every call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["Choose", "Generation", "KVCache", "argmax_choose", "generation_capacity", "pow2_at_least", "stop_ids"]

# choose(step, logits fp32 [B, vocab] on the device) -> token ids [B] (long)
Choose = Callable[[int, torch.Tensor], torch.Tensor]


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def generation_capacity(longest: int) -> int:
    """The KV-cache capacity `generate` uses for `longest` positions (prompt + new tokens)."""
    return pow2_at_least(longest)


def argmax_choose(step: int, logits: torch.Tensor) -> torch.Tensor:
    """Greedy choice: the argmax of each row, ties to the first (lowest) id on CPU and CUDA."""
    return torch.argmax(logits, dim=-1)


def stop_ids(eos_id) -> frozenset[int]:
    """eos_id (None, an id or a collection of ids) as a set of ids."""
    if eos_id is None:
        return frozenset()
    return frozenset(int(e) for e in (eos_id if isinstance(eos_id, (list, tuple, set, frozenset)) else [eos_id]))


class KVCache:
    """Keys and values of B sequences, per layer [B, KV, capacity, D] bf16, zero-filled (a
    position never written stays exactly 0: attend_decode relies on it), and each
    sequence's length (positions 0..length-1 hold its tokens)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, device):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.capacity = capacity
        self.lengths = [0] * batch  # on the host: no device sync to size a step


@dataclass
class Generation:
    """What generate returns: the new ids per prompt, and (keep_logits) the fp32 logits
    [B, vocab] each new token was chosen from, one tensor per step."""

    ids: list[list[int]]
    step_logits: list[torch.Tensor] = field(default_factory=list)
