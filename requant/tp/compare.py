"""Bitwise comparison of one tensor-parallel run with the TP-1 run of the same inputs.

compare(ref, got) -> a JSON-ready dict:
  identical              prefill logits, greedy ids and every decode step's logits equal, bit for bit
  logits_first_diff      {"prompt", "position"} of the first prefill position (prompt order, then
                         position) with any differing logit bit, or None
  logits_differing       how many prefill logits differ (elements), of logits_total
  logits_max_abs_diff    the largest |difference| of a prefill logit (0.0 when identical)
  tokens_first_diff      {"prompt", "step"} of the earliest differing greedy token (lowest step,
                         then lowest prompt), or None
  prompts_tokens_differ  how many prompts' greedy sequences differ anywhere
  steps_first_diff       {"step", "prompt"} of the first decode step whose logits differ, or None
digest(logits, ids, steps) -> sha256 hex of the bits of all three (equal digests: identical runs), for
runs whose logits are too large to keep (benchmarks) or that ran in other launches.
"""

from __future__ import annotations

import hashlib
import json

import torch

__all__ = ["bits_equal", "compare", "digest"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def compare(ref, got) -> dict:
    """ref, got: requant.tp.launch.Result (logits per prompt, ids, step logits)."""
    first = None
    differing = 0
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref.logits, got.logits)):
        if a.shape != b.shape:
            raise ValueError(f"prompt {i}: logits of shape {tuple(a.shape)} and {tuple(b.shape)}")
        diff = _bits(a) != _bits(b)
        if bool(diff.any()):
            rows = diff.any(dim=1).nonzero().flatten()
            if first is None:
                first = {"prompt": i, "position": int(rows[0])}
            differing += int(diff.sum())
            worst = max(worst, float((a.to(torch.float32) - b.to(torch.float32)).abs().max()))
    tokens = None
    prompts_differ = 0
    for i, (a, b) in enumerate(zip(ref.ids, got.ids)):
        j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None and len(a) != len(b):
            j = min(len(a), len(b))
        if j is not None:
            prompts_differ += 1
            if tokens is None or j < tokens["step"]:
                tokens = {"prompt": i, "step": j}
    steps = None
    for s, (a, b) in enumerate(zip(ref.steps, got.steps)):
        diff = (_bits(a) != _bits(b)).any(dim=1)
        if bool(diff.any()):
            steps = {"step": s, "prompt": int(diff.nonzero().flatten()[0])}
            break
    if steps is None and len(ref.steps) != len(got.steps):
        steps = {"step": min(len(ref.steps), len(got.steps)), "prompt": 0}
    return {
        "identical": first is None and tokens is None and steps is None,
        "logits_first_diff": first,
        "logits_differing": differing,
        "logits_total": sum(t.numel() for t in ref.logits),
        "logits_max_abs_diff": worst,
        "tokens_first_diff": tokens,
        "prompts_tokens_differ": prompts_differ,
        "steps_first_diff": steps,
    }


def digest(logits: list[torch.Tensor], ids: list[list[int]], steps: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for group in (logits, steps):
        h.update(f"{len(group)};".encode())
        for t in group:
            h.update(f"{tuple(t.shape)}{t.dtype};".encode())
            h.update(_bits(t.detach().cpu()).numpy().tobytes())
    h.update(json.dumps(ids).encode())
    return h.hexdigest()
