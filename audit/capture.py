"""Calibration prompts, tokenization, and the capture of every quantized Linear's operands.

Prompts: a fixed built-in set of short English sentences (`--prompts N` takes the first N).
Tokenization: the checkpoint's tokenizer.json through the `tokenizers` library when both
exist; otherwise byte-level ids (token id = UTF-8 byte value, clipped to vocab - 1), which is
the embedded default's own vocabulary and a valid input for any model.

Capture: each regime's activations come from that regime's own forward pass (pow2 weights
produce slightly different hidden states, and the pow2 model is what would be served after
conversion; comparing the kernels on the operands each model really produces is the
claim the audit makes). The forward pass runs with the first backend of the pair. Each
Linear's int8 activations and scales are recorded once per distinct input (q/k/v share one
quantized input, gate/up another) and concatenated over prompts along the token axis
(the runtime packs all prompts into one pass, so there is one part per input), so every
Linear gets one operand set [M, K] with M = total prompt tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from requant.audit.records import Activations

CALIBRATION_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "In 1905, Albert Einstein published four papers that changed physics.",
    "To bake bread, mix flour, water, salt and yeast, then let the dough rise.",
    "The mitochondria is the powerhouse of the cell.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Rivers carry sediment from the mountains down to the sea.",
    "She asked whether the train to Lisbon left before noon.",
    "Prime numbers have exactly two distinct positive divisors.",
    "The committee will meet on Tuesday to review the budget proposal.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "A good night's sleep improves memory and concentration.",
    "The orchestra tuned their instruments before the concert began.",
    "Photosynthesis converts light energy into chemical energy.",
    "He wrote the report in plain language so everyone could follow it.",
    "Interest rates rose for the third consecutive quarter.",
    "The library closes at eight o'clock on weekdays.",
)


def prompts(n: int) -> list[str]:
    if n < 1:
        raise ValueError("--prompts must be at least 1")
    if n > len(CALIBRATION_PROMPTS):
        raise ValueError(f"--prompts at most {len(CALIBRATION_PROMPTS)} (the built-in calibration set)")
    return list(CALIBRATION_PROMPTS[:n])


def tokenizer_for(path: Path | None, vocab: int):
    """A function text -> list of ids, and a word saying which tokenizer it is."""
    if path is not None and (Path(path) / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            Tokenizer = None
        if Tokenizer is not None:
            tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            return (lambda text: [min(i, vocab - 1) for i in tok.encode(text).ids]), "tokenizer.json"
    return (lambda text: [min(b, vocab - 1) for b in text.encode("utf-8")]), "byte-level"


class Capture:
    """Records (int8 activations, scales) per group of Linears sharing one input."""

    def __init__(self):
        self._parts: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def record(self, names: tuple[str, ...], q: torch.Tensor, s: torch.Tensor) -> None:
        self._parts.setdefault(names, []).append((q, s))

    def operands(self) -> dict[str, Activations]:
        out = {}
        for names, parts in self._parts.items():
            act = Activations(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]))
            for n in names:
                out[n] = act  # shared object: one digest for q/k/v, one for gate/up
        return out


def run_prompts(model, token_lists: list[list[int]], backend: str, capture: Capture | None, device) -> torch.Tensor:
    """Prefill every prompt (packed into one pass); logits [sum T, vocab]."""
    with torch.no_grad():
        return model.forward([torch.tensor(ids, dtype=torch.long, device=device) for ids in token_lists], backend, capture)
