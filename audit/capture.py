"""Calibration prompts and the capture of every quantized Linear's operands.

Prompts: the built-in English calibration set (requant.models.prompts, shared with `requant
determinism`; `--prompts N` takes the first N), tokenized with the checkpoint's tokenizer
(requant.models.tokenizer: tokenizer.json when the checkpoint has one, else byte-level ids; the
audit records which, tok.describe(), in its JSON and report).

Capture: each regime's activations come from that regime's own forward pass (pow2 weights
produce slightly different hidden states, and the pow2 model is what would be served after
conversion; comparing the kernels on the operands each model really produces is the
claim the audit makes). The forward pass (requant.runtime) runs with the first backend of
the pair. Each Linear's int8 activations and scales are recorded once per distinct input
(q/k/v share one quantized input, gate/up another); the runtime packs all prompts along
the token axis (attention stays per prompt), so there is one part per input and every
Linear gets one operand set [M, K] with M = total prompt tokens.
"""

from __future__ import annotations

import torch

from requant.audit.records import Activations
from requant.models.prompts import CALIBRATION_PROMPTS, prompts

__all__ = ["CALIBRATION_PROMPTS", "prompts", "Capture", "run_prompts"]


class Capture:
    """Records (int8 activations, scales) per group of Linears sharing one input."""

    def __init__(self):
        self._parts: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # Qwen3-MoE: each sparse block's route (expert ids, weights [T, k]) of the one packed prefill
        self.routes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record_route(self, block: str, ids: torch.Tensor, weights: torch.Tensor) -> None:
        self.routes[block] = (ids, weights)

    def record(self, names: tuple[str, ...], q: torch.Tensor, s: torch.Tensor) -> None:
        self._parts.setdefault(names, []).append((q, s))

    def operands(self) -> dict[str, Activations]:
        out = {}
        for names, parts in self._parts.items():
            if len(parts) == 1:  # one call (a decode step's, an expert's): its tensors, not a copy
                act = Activations(*parts[0])
            else:
                act = Activations(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]))
            for n in names:
                out[n] = act  # shared object: one digest for q/k/v, one for gate/up
        return out


def run_prompts(model, token_lists: list[list[int]], backend: str, capture: Capture | None) -> torch.Tensor:
    """Prefill every prompt with `backend` (one packed pass, attention per prompt); logits
    [sum T, vocab] in prompt order. model: a requant.runtime.Model."""
    return torch.cat(model.with_backends(backend).logits(token_lists, capture=capture))
