"""The decode phase: every quantized Linear's operands while the model decodes, per step.

Served tokens are made in decode, one token per sequence per step, so every GEMM runs at
M = the batch, where a kernel may pick another configuration than for a long prefill (a
decode tile, a tile chosen by M). Prefill evidence says nothing about that configuration.

Capture: for each batch size B, the first B audit prompts (cycled when there are fewer)
are prefilled into a KV cache by the reference engine with the pair's first backend, then
`steps` tokens are decoded greedily; each decode step's quantized inputs are recorded
(Model.decode_step(capture=...): q/k/v share one record, gate/up another), so every Linear
has one operand set [B, K] per step. The per-layer comparison and the 21 fault variants run
on each step's operands at that step's M (steps are never concatenated: the decode
configuration is the point), scored with the same matrix cells as prefill: the cells of
the matrix say nothing about M.

End to end (C7): the second backend decodes the same tokens (teacher-forced on the first
backend's choices, so both see the same prefixes), and C7 compares the two runs' decode
logits, all steps of one batch size together.
"""

from __future__ import annotations

import torch

from requant.audit.capture import Capture
from requant.audit.checks import token_risk

__all__ = ["DEFAULT_BATCHES", "DEFAULT_STEPS", "batch_prompts", "decode_operands", "decode_logits"]

DEFAULT_BATCHES = (1, 8)
DEFAULT_STEPS = 4


def batch_prompts(token_lists: list[list[int]], batch: int) -> list[list[int]]:
    """The first `batch` prompts, cycling through the list when it is shorter."""
    return [token_lists[i % len(token_lists)] for i in range(batch)]


def _cache_for(model, tensors, steps):
    from requant.runtime.cache import generation_capacity

    return model.new_cache(len(tensors), generation_capacity(max(len(t) for t in tensors) + steps))


def decode_operands(model, token_lists, steps: int):
    """Greedy decode of `steps` tokens (reference engine, the model's backend). Returns
    (operands per step: [{linear: Activations [B, K]}], tokens fed per step [B], logits per
    step [B, vocab])."""
    tensors = model._as_tensors(token_lists)
    cache = _cache_for(model, tensors, steps)
    ops, fed, logits = [], [], []
    with torch.no_grad():
        last = model.prefill(tensors, cache=cache, last_only=True)
        for _ in range(steps):
            tok = torch.argmax(last, dim=-1)
            cap = Capture()
            last = model.decode_step(tok, cache, capture=cap)
            ops.append(cap.operands())
            fed.append(tok)
            logits.append(last)
    return ops, fed, logits


def decode_logits(model, token_lists, fed: list[torch.Tensor]) -> list[torch.Tensor]:
    """The model's decode logits when it is fed the given tokens (teacher-forced)."""
    tensors = model._as_tensors(token_lists)
    cache = _cache_for(model, tensors, len(fed))
    out = []
    with torch.no_grad():
        model.prefill(tensors, cache=cache, last_only=True)
        for tok in fed:
            out.append(model.decode_step(tok, cache))
    return out


def decode_risk(logits_a: list[torch.Tensor], logits_b: list[torch.Tensor]) -> dict:
    """token_risk over every decode step of one batch size."""
    return token_risk(torch.cat(logits_a), torch.cat(logits_b))
