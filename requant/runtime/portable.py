"""The portable engine: the fast engine's layer, in an arithmetic every machine computes the same.

`load_model(..., engine="portable")`. The fast engine's layer, packing, caches, buckets and CUDA
graphs (requant/runtime/fast.py), with every operation whose bits depend on the machine replaced:
attention dot products in a fixed lane order with a software exp2, SiLU with a software exp, the
bf16 lm_head in a fixed lane order, RoPE tables made on the host from float64 + and *. Two
implementations of the same operations: kernels="triton" (kernels/triton/portable.py and the fused
row kernels; CUDA, or the CPU under TRITON_INTERPRET=1) and kernels="torch" (the specification,
kernels/portable.py, on the CPU); "auto" picks triton on CUDA, torch elsewhere, and
REQUANT_PORTABLE_KERNELS=triton|torch overrides it. A record made by this engine carries
"arithmetic": ARITHMETIC. The specification: docs/runtime.md#the-portable-arithmetic.
"""

from __future__ import annotations

import copy
import os

import torch

from requant import kernels
from requant.kernels import portable as spec
from requant.kernels import reference
from requant.kernels.bf16 import round_fp32_to_bf16
from requant.kernels.emulation import qk_norm_rope_ref, rms_norm_ieee
from requant.kernels.reference import accumulate, quantize_activations
from requant.models.qwen3_moe import Qwen3MoeArch
from requant.runtime.fast import FastEngine, FastLayout, FastOps, fast_supported

__all__ = ["ARITHMETIC", "PortableEngine", "PortableLayout", "portable_supported", "with_kernels"]

ARITHMETIC = spec.ARITHMETIC
KERNELS = ("auto", "triton", "torch")


def portable_supported(model) -> str | None:
    """Why `model` cannot run the portable engine (None when it can)."""
    if isinstance(model.arch, Qwen3MoeArch):
        return "a Qwen3-MoE model (this engine runs dense Qwen3; the reference and fast engines run the experts)"
    why = fast_supported(model)
    if why is None or why.startswith("a CPU device"):
        return None
    return why


def _kernels_for(model, kernels_: str) -> str:
    if kernels_ == "auto":
        kernels_ = os.environ.get("REQUANT_PORTABLE_KERNELS", "auto") or "auto"
    if kernels_ not in KERNELS:
        raise ValueError(f"REQUANT_PORTABLE_KERNELS must be triton or torch, got {kernels_!r}")
    if kernels_ == "auto":
        return "triton" if model.device.type == "cuda" else "torch"
    if kernels_ == "triton" and model.device.type != "cuda":
        from requant.kernels.triton import _launch

        if not _launch.INTERPRET:
            raise ValueError("the portable engine's Triton kernels need CUDA or TRITON_INTERPRET=1")
    if kernels_ == "torch" and model.device.type != "cpu":
        raise ValueError("the portable engine's torch kernels run on the CPU")
    return kernels_


class PortableLayout(FastLayout):
    """FastLayout with the portable RoPE tables (kernels.portable.rope_tables, made on the host)."""

    def __init__(self, model):
        super().__init__(model)
        a = model.arch
        cos, sin = spec.rope_tables(model.max_length, a.head_dim, a.rope_theta)
        self.cos = cos.to(model.device)
        self.sin = sin.to(model.device)


_EPILOGUES = {
    "reference-cutlass-order": "epilogue_cutlass_order",
    "reference-triton-order": "epilogue_triton_order",
    "reference-fused-order": "epilogue_fused_order",
    "reference": "epilogue_exact",
}
_CHECKS: dict = {}  # id of a weight -> (the weight, a fixed half of its rows, [K, 2] column sums)


def _checks(w: torch.Tensor):
    hit = _CHECKS.get(id(w))
    if hit is not None and hit[0] is w:
        return hit[1], hit[2]
    if len(_CHECKS) > 4096:
        _CHECKS.clear()
    g = torch.Generator().manual_seed(w.shape[0] * 1_000_003 + w.shape[1])
    half = torch.randperm(w.shape[0], generator=g)[: (w.shape[0] + 1) // 2].sort().values
    # int32 sums of int8 rows (|sum| <= 128 N: exact); elementwise, no matrix product
    v = torch.stack([w.sum(0, dtype=torch.int32), w[half].sum(0, dtype=torch.int32)], 1).to(torch.int64)
    _CHECKS[id(w)] = (w, half, v)
    return half, v


def exact_accumulate(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The exact int32 accumulator a @ w^T of int8 operands on the CPU: torch._int_mm (fast), checked
    against two exact int64 projections (each row's sum over every output and over a fixed random
    half of them, against a times the matching column sums of w: a wrong element passes only if
    errors cancel in both); kernels.reference.accumulate (float64, exact by construction, slow) when
    the check fails or _int_mm refuses the shape."""

    try:
        acc = torch._int_mm(a, w.T)
    except RuntimeError:
        return accumulate(a, w)
    half, v = _checks(w)
    acc64 = acc.to(torch.int64)
    got = torch.stack([acc64.sum(1), acc64[:, half].sum(1)], 1)
    want = (a.to(torch.int64)[:, :, None] * v[None]).sum(1)
    if not torch.equal(got, want):
        return accumulate(a, w)
    return acc


class _TorchOps:
    """The portable operations in torch on the CPU (the specification)."""

    @staticmethod
    def scaled_mm(q, w, s, s_w, backend):
        name = _EPILOGUES.get(kernels.emulation_of(backend) or "")
        if name is None or q.device.type != "cpu":
            return kernels.scaled_mm(q, w, s, s_w, backend=backend)
        reference.check_operands(q, w, s, s_w)
        return getattr(reference, name)(exact_accumulate(q, w), s, s_w)

    @staticmethod
    def add_rms_norm(x, w, eps, delta=None, quantize=True, write_h=False, rows=None):

        if delta is not None:
            x.copy_(round_fp32_to_bf16(x.to(torch.float32) + delta.to(torch.float32)))
        xs = x if rows is None else x[rows.long()]
        h = rms_norm_ieee(xs, w, eps)
        q, s = quantize_activations(h, check=False) if quantize else (None, None)
        return (h if write_h else None), q, s

    @staticmethod
    def qk_norm_rope(qkv, q_w, k_w, cos, sin, pos, rows, k_cache, v_cache, heads, kv_heads, eps):

        q, k, v = qk_norm_rope_ref(qkv, q_w, k_w, cos, sin, pos, heads, kv_heads, eps)
        r, p = rows.long(), pos.long()
        k_cache[r, :, p] = k
        v_cache[r, :, p] = v
        return q

    @staticmethod
    def attention(q, k_cache, v_cache, pos, rows, blocks, scale):
        return spec.attention(q, k_cache, v_cache, pos, rows, scale)

    @staticmethod
    def quantize(x):
        return quantize_activations(x, check=False)

    @staticmethod
    def silu_mul_quantize(gu):
        return quantize_activations(spec.silu_mul(gu), check=False)

    def __init__(self, layout):
        self.layout = layout

    def dense(self, h, w, out=None):
        wp = getattr(self.layout, "dense_prepared", None)  # fp32 lanes layout of the lm_head, made once
        if wp is None or wp[0] is not w:
            wp = self.layout.dense_prepared = (w, spec.prepare_dense(w))
        y = spec.dense_prepared(h, wp[1])
        if out is not None:
            out.copy_(y)
            return out
        return y


class _TritonOps(FastOps):
    """The fast engine's kernels with the portable SiLU, attention and lm_head."""

    def __init__(self):
        super().__init__()
        from requant.kernels.triton import portable as tp

        self.silu_mul_quantize = tp.silu_mul_quantize
        self.dense = tp.dense
        self._attention = tp.attention


class PortableEngine(FastEngine):
    """The portable engine of `model` over a shared PortableLayout; kernels: auto, triton or torch."""

    name = "portable"
    arithmetic = ARITHMETIC

    def __init__(self, model, layout: PortableLayout | None = None, kernels_: str = "auto"):
        layout = layout if layout is not None else PortableLayout(model)
        self.kernels = _kernels_for(model, kernels_)
        super().__init__(model, layout, _TritonOps() if self.kernels == "triton" else _TorchOps(layout))

    def tokens_per_block(self) -> int:
        a = self.model.arch
        if self.kernels == "torch":
            return 64  # the torch attention reads positions and rows, not blocks
        from requant.kernels.triton.portable import tokens_per_block

        return tokens_per_block(a.heads, a.kv_heads)


def with_kernels(model, kernels_: str):
    """A copy of a portable-engine `model` (weights and layout shared) running the other kernels."""
    if model.engine != "portable":
        raise ValueError(f"the model runs the {model.engine} engine, not the portable one")
    m = copy.copy(model)
    m.impl = PortableEngine(m, model.impl.layout, kernels_)
    return m
