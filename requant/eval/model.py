"""The one place evaluation gets its model from.

`requant.runtime.load_model` (the shared runtime: KV cache, batched prompts, backends by
name) is the real thing. Until it is merged, `requant.eval._runtime_shim` provides the
subset eval uses on top of the audit runtime; delete the shim and this fallback at
integration, nothing else imports it.
"""

from __future__ import annotations

try:
    from requant.runtime import load_model
except ImportError:  # requant.runtime not merged yet: the temporary shim
    from requant.eval._runtime_shim import load_model

__all__ = ["load_model"]
