"""The one place evaluation gets its model from: the shared runtime (`requant.runtime`:
KV cache, batched prompts, backends by name, bf16 directories)."""

from __future__ import annotations

from requant.runtime import load_model

__all__ = ["load_model"]
