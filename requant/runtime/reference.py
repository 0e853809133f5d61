"""The reference engine: the Qwen3 forward in plain torch ops (kernels/ops.py), the
CPU oracle, the path of the audit's capture, and the layer code tensor parallelism reuses.

The layer takes its Linears as a strategy object (`Linears`: column(x, names, capture) for
the Linears that share one input, row(x, name, capture) for o_proj and down_proj, head(x,
capture) for the lm_head and its fp32 logits). `DeviceLinears` is one device's:
kernels.quantize_activations once per shared input, kernels.scaled_mm(q, w, s, s_w,
backend=model.backend) with `w, s_w = model.linears[name]`, dense_rows for a Linear the
checkpoint does not quantize. requant/tp/engine.py supplies the sharded strategy (its
all-reduces and all-gathers) and a per-head prompt attention, and runs this same forward.

capture: an object with record(names, q int8 [M, K], s fp32 [M, 1]), called once per
quantized input (q/k/v share one record, gate/up another; o, down, lm_head), in prefill
(M = the packed tokens) and in decode_step (M = the batch). The numerics and the batch
invariance argument: docs/runtime.md.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from requant import kernels
from requant.kernels.ops import apply_rope, attend_decode, attend_prompt, dense_rows, rms_norm, rope_tables, silu_mul
from requant.models.qwen3_moe import Qwen3MoeArch
from requant.runtime.cache import KVCache, pow2_at_least
from requant.runtime.engine import EagerDecoder
from requant.runtime.moe import sparse_block

__all__ = ["DeviceLinears", "ReferenceEngine", "decode_attention"]


class DeviceLinears:
    """The Linears of one device, read from `model` at each call (model.linears, .backend,
    .act_backend, .dense; fp32 copies of dense weights cached in model._fp32)."""

    def __init__(self, model):
        self.model = model

    def _weight32(self, name: str) -> torch.Tensor:
        cache = self.model._fp32
        w = cache.get(name)
        if w is None:
            w = cache[name] = self.model.dense[name + ".weight"].to(torch.float32)
        return w

    def column(self, x: torch.Tensor, names: tuple[str, ...], capture) -> list[torch.Tensor]:
        """Linears that share the input x; it is quantized once (shared operands)."""
        m = self.model
        if not any(n in m.linears for n in names):
            return [self.dense(x, n) for n in names]
        q, s = kernels.quantize_activations(x, backend=m.act_backend)
        return self.quantized(q, s, names, capture, x)

    def quantized(self, q, s, names: tuple[str, ...], capture, x=None) -> list[torch.Tensor]:
        """column on operands already quantized (q int8 [M, K], s fp32 [M, 1]); x (bf16) only for
        names the checkpoint keeps dense. The MoE block quantizes a layer's tokens once and gives
        each expert its rows: per-token quantization is a function of the row alone."""
        m = self.model
        quantized = tuple(n for n in names if n in m.linears)
        if capture is not None and quantized:
            capture.record(quantized, q, s)
        # A kernel object may compute several Linears of one input in one call (the audit's fault
        # injector does: audit/phases/injection.FaultInjector.shared_input); it owes the bits of one
        # call per Linear.
        shared = self._kernel_hook("shared_input")
        if shared is not None and len(names) > 1 and quantized == tuple(names):
            return shared(q, s, [m.linears[n] for n in names])
        outs = []
        for n in names:
            if n in m.linears:
                w, s_w = m.linears[n]
                outs.append(kernels.scaled_mm(q, w, s, s_w, backend=m.backend))
            else:
                outs.append(self.dense(x, n))
        return outs

    def rows_of(self, rows: torch.Tensor, total: int):
        """A context whose calls get the rows `rows` of a batch of `total` (the MoE block's experts).
        A kernel object that computes blocks of rows apart needs their positions (the audit's fault
        injector: audit/phases/injection.FaultInjector.rows_of); the others ignore it."""
        hook = self._kernel_hook("rows_of")
        return hook(rows, total) if hook is not None else nullcontext()

    def _kernel_hook(self, name: str):
        """The model's kernel object's method `name`, if it has one (kernels.ScaledMM.fn)."""
        return getattr(getattr(self.model.backend, "fn", None), name, None)

    def dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """A Linear the checkpoint keeps in bf16 (the lm_head, say): fixed-chunk fp32 rows."""
        return dense_rows(x, self._weight32(name))

    def row(self, x: torch.Tensor, name: str, capture) -> torch.Tensor:
        (y,) = self.column(x, (name,), capture)
        return y

    def head(self, x: torch.Tensor, capture) -> torch.Tensor:
        return self.row(x, "lm_head", capture).to(torch.float32)


def decode_attention(cache: KVCache, arch, device) -> tuple[torch.Tensor, torch.Tensor, Callable]:
    """For one decode step (one new token per row of `cache`, at position = its length): the
    RoPE tables and attend(i, q, k, v), which writes layer i's new keys and values into the
    cache and attends over each row's positions (attend_decode over a power-of-two span)."""
    longest = max(cache.lengths) + 1
    if longest > cache.capacity:
        raise ValueError(f"KV cache full: {longest} positions > capacity {cache.capacity}")
    span = min(pow2_at_least(longest), cache.capacity)
    pos = torch.tensor(cache.lengths, dtype=torch.long, device=device)
    rows = torch.arange(len(cache.lengths), device=device)
    cos, sin = rope_tables(pos, arch.head_dim, arch.rope_theta)
    scale = arch.head_dim**-0.5

    def attend(i, q, k, v):
        cache.k[i][rows, :, pos] = k
        cache.v[i][rows, :, pos] = v
        return attend_decode(q, cache.k[i][:, :, :span], cache.v[i][:, :, :span], pos + 1, scale)

    return cos, sin, attend


class ReferenceEngine:
    """An `Engine` (runtime/engine.py): the torch-ops forward of `model` (its arch, dense, device, tree), with `linears` (default
    DeviceLinears(model)), `heads`/`kv_heads` the attention heads this engine holds (default:
    all) and `prompt_attention(q, k, v, scale)` for one prompt (default kernels.ops.attend_prompt)."""

    name = "reference"

    def __init__(
        self, model, linears=None, heads: int | None = None, kv_heads: int | None = None, prompt_attention=None
    ):
        self.model = model
        self.linears = linears if linears is not None else DeviceLinears(model)
        self.heads = heads if heads is not None else model.arch.heads
        self.kv_heads = kv_heads if kv_heads is not None else model.arch.kv_heads
        self.prompt_attention = prompt_attention if prompt_attention is not None else attend_prompt

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        a = self.model.arch
        return KVCache(a.layers, batch, self.kv_heads, capacity, a.head_dim, self.model.device)

    # -- the forward ------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.model.arch.eps, tree=self.model.tree)

    def layer(self, i: int, x: torch.Tensor, cos, sin, attend, capture) -> torch.Tensor:
        """One decoder layer on packed tokens x [T, hidden]; attend(i, q, k, v) -> [T, heads*D]."""
        a, d, lin = self.model.arch, self.model.dense, self.linears
        p = f"model.layers.{i}."
        t = x.shape[0]
        h = self._norm(x, d[p + "input_layernorm.weight"])
        q, k, v = lin.column(h, (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"), capture)
        q = apply_rope(self._norm(q.view(t, self.heads, a.head_dim), d[p + "self_attn.q_norm.weight"]), cos, sin)
        k = apply_rope(self._norm(k.view(t, self.kv_heads, a.head_dim), d[p + "self_attn.k_norm.weight"]), cos, sin)
        attn = attend(i, q, k, v.view(t, self.kv_heads, a.head_dim))
        x = x + lin.row(attn, p + "self_attn.o_proj", capture)
        h = self._norm(x, d[p + "post_attention_layernorm.weight"])
        if isinstance(a, Qwen3MoeArch) and a.is_moe(i):  # a Qwen3-MoE sparse layer (runtime/moe.py)
            return x + sparse_block(self, i, h, capture)
        gate, up = lin.column(h, (p + "mlp.gate_proj", p + "mlp.up_proj"), capture)
        return x + lin.row(silu_mul(gate, up), p + "mlp.down_proj", capture)

    def head(self, x: torch.Tensor, capture) -> torch.Tensor:
        return self.linears.head(self._norm(x, self.model.dense["model.norm.weight"]), capture)

    def prefill(
        self, prompts: list[torch.Tensor], cache: KVCache | None = None, capture=None, last_only: bool = False
    ) -> torch.Tensor:
        """Packed prefill of 1-D id tensors. fp32 logits [sum T, vocab] (last_only: [B, vocab],
        each prompt's last position). With a cache, each prompt's keys and values go to its
        row of the cache and its length is set."""
        a, dev = self.model.arch, self.model.device
        lens = [len(p) for p in prompts]
        bounds, s = [], 0
        for n in lens:
            bounds.append((s, s + n))
            s += n
        ids = torch.cat(prompts).to(dev)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        cos, sin = rope_tables(pos, a.head_dim, a.rope_theta)
        scale = a.head_dim**-0.5
        one_prompt = self.prompt_attention

        def attend(i, q, k, v):
            if cache is not None:
                for j, (lo, hi) in enumerate(bounds):
                    cache.k[i][j, :, : hi - lo] = k[lo:hi].transpose(0, 1)
                    cache.v[i][j, :, : hi - lo] = v[lo:hi].transpose(0, 1)
            return torch.cat([one_prompt(q[lo:hi], k[lo:hi], v[lo:hi], scale) for lo, hi in bounds])

        x = self.model.dense["model.embed_tokens.weight"][ids].to(torch.bfloat16)
        for i in range(a.layers):
            x = self.layer(i, x, cos, sin, attend, capture)
        if cache is not None:
            cache.lengths = list(lens)
        if last_only:
            x = x[torch.tensor([hi - 1 for _, hi in bounds], device=dev)]
        return self.head(x, capture)

    def extend(self, chunks, cache: KVCache) -> torch.Tensor:
        raise ValueError("extend needs the fast engine")

    def decode_step(self, tokens: torch.Tensor, cache: KVCache, capture=None) -> torch.Tensor:
        """One new token per sequence of the cache (tokens [B] ids, at position = its length);
        appends to the cache and returns fp32 logits [B, vocab]."""
        a, dev = self.model.arch, self.model.device
        cos, sin, attend = decode_attention(cache, a, dev)
        x = self.model.dense["model.embed_tokens.weight"][tokens.reshape(-1).to(dev)].to(torch.bfloat16)
        for i in range(a.layers):
            x = self.layer(i, x, cos, sin, attend, capture)
        cache.lengths = [n + 1 for n in cache.lengths]
        return self.head(x, capture)

    def decoder(self, batch: int, capacity: int, graphs: bool) -> EagerDecoder:
        """decode_step on a cache of `batch` rows (graphs: no CUDA graphs here)."""
        return EagerDecoder(self, batch, capacity)
