"""The GEMM shapes of the real Qwen3 models, for the kernel benchmarks, derived from the presets
of requant.checkpoint.synthetic (requant.models.qwen3.Qwen3Arch.layer_linear_shapes) rather than copied.

QWEN3: {"Qwen3-1.7B": [("q,o", N, K, count), ("k,v", ...), ("gate,up", ...), ("down", ...)], ...}:
per model, each distinct [N, K] = [out, in] of one decoder layer's quantized Linears, the Linears
that share it (short names joined by commas, in model order) and how many they are.
Checked against the published configs in tests/benchmarks/test_plumbing.py.
"""

from __future__ import annotations

from requant.checkpoint.synthetic import PRESETS
from requant.models.qwen3 import LAYER_LINEARS, Qwen3Arch

__all__ = ["MODELS", "QWEN3", "linear_groups"]

MODELS = {"Qwen3-1.7B": "qwen3-1.7b", "Qwen3-8B": "qwen3-8b", "Qwen3-14B": "qwen3-14b"}  # name -> preset


def linear_groups(arch: Qwen3Arch) -> list[tuple[str, int, int, int]]:
    """(names, N, K, count) per distinct shape of one decoder layer, in order of first use."""
    groups: dict[tuple[int, int], list[str]] = {}
    shapes = arch.layer_linear_shapes()
    for leaf in LAYER_LINEARS:
        short = leaf.rsplit(".", 1)[1].removesuffix("_proj")
        groups.setdefault(shapes[leaf], []).append(short)
    return [(",".join(names), n, k, len(names)) for (n, k), names in groups.items()]


QWEN3 = {name: linear_groups(PRESETS[preset]) for name, preset in MODELS.items()}
