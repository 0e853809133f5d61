"""The fast engine: fused Triton kernels, one attention for prefill and decode, a bf16 lm_head
with one fixed tile, and decode steps replayed from CUDA graphs.

`FastEngine` is an `Engine` (requant/runtime/engine.py); `Model` picks it on CUDA when
`fast_supported` allows. Its weights are laid out once (`FastLayout`: q/k/v and gate/up stacked
along N, the same bits as separate GEMMs) and shared by every with_backends copy. Its decoder
(`_Decoder`) pads the batch to a bucket (BUCKETS) and replays the step from a CUDA graph; the
graph holds the forward only, so `choose` sees the same bits eager or replayed. capture
(prefill and decode_step, eager only) records what its GEMMs consume: the reference engine's
names and shapes, not its values. The layer, the kernels' numerics and why a token's logits are
the same bits prefilled, extended, decoded, batched or replayed: docs/runtime.md#two-engines.
"""

from __future__ import annotations

import gc

import torch

from requant import kernels
from requant.kernels.ops import rope_tables
from requant.models.qwen3 import LAYER_LINEARS
from requant.models.qwen3_moe import Qwen3MoeArch
from requant.runtime.cache import KVCache
from requant.runtime.fast_moe import expert_layout, sparse_block

__all__ = ["BUCKETS", "FastEngine", "FastLayout", "FastOps", "capture_graph", "fast_supported"]

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
_KEEP_DECODERS = 2


def fast_supported(model) -> str | None:
    """Why `model` cannot run the fast path (None when it can)."""
    a = model.arch
    for i in range(a.layers):
        for n in _layer_linears(a, i):
            if f"model.layers.{i}.{n}" not in model.linears:
                return f"model.layers.{i}.{n} is not quantized (the fast path runs W8A8 decoder layers only)"
    if (a.heads // a.kv_heads) > 64 or 64 % (a.heads // a.kv_heads):
        return f"a GQA group of {a.heads // a.kv_heads} heads"
    if a.head_dim & (a.head_dim - 1) or a.head_dim < 16:
        return f"head_dim {a.head_dim} (a power of two >= 16 is needed)"
    dev = model.device
    if dev.type != "cuda":
        from requant.kernels.triton import _launch

        if not _launch.INTERPRET:
            return "a CPU device without TRITON_INTERPRET=1"
    return None


def _is_moe(a, i: int) -> bool:
    return isinstance(a, Qwen3MoeArch) and a.is_moe(i)


def _layer_linears(a, i: int) -> list[str]:
    """Layer i's quantized Linears the fast path needs: a sparse layer's experts for its MLP."""
    if not _is_moe(a, i):
        return list(LAYER_LINEARS)
    att = [n for n in LAYER_LINEARS if n.startswith("self_attn.")]
    return att + [f"mlp.experts.{e}.{leaf}" for e in range(a.experts) for leaf in ("gate_proj", "up_proj", "down_proj")]


def _stack(linears, names):
    ws = [linears[n][0] for n in names]
    ss = [linears[n][1] for n in names]
    w = torch.cat(ws).contiguous()
    s = torch.cat(ss).contiguous()
    a = 0
    for n, part in zip(names, ws):  # the model's own entries become views of the stacked tensors (same values)
        b = a + part.shape[0]
        linears[n] = (w[a:b], s[a:b])
        a = b
    return w, s


class _Decoder:
    """Static buffers, a KV cache and (once captured) the CUDA graph of one decode step: the
    forward of `tok` at `pos` into `logits`, then pos += 1. A `Decoder` (runtime/engine.py)."""

    static_logits = True  # step returns a view of self.logits
    sync_every = 16  # the loop reads ids on the host every 16 steps: no sync between replays

    def __init__(self, engine: FastEngine, bucket: int, capacity: int, graphs: bool):
        dev = engine.model.device
        self.bucket = bucket
        self.cache = engine.new_cache(bucket, capacity)
        self.tok = torch.zeros(bucket, dtype=torch.long, device=dev)
        self.pos = torch.zeros(bucket, dtype=torch.int32, device=dev)
        self.rows = torch.arange(bucket, dtype=torch.int32, device=dev)
        self.blocks = torch.stack([self.rows, torch.ones_like(self.rows), self.rows], 1).contiguous()
        self.logits = torch.empty(bucket, engine.model.arch.vocab, dtype=torch.float32, device=dev)
        self.engine = engine
        self.graphs = graphs and dev.type == "cuda" and not engine.layout.moe
        self.graph = None
        self.eager_steps = 0

    def start(self, lengths: list[int]) -> None:
        """After a prefill of rows 0..len(lengths)-1: decode from their lengths; the padding rows
        decode token 0 from position 0 in rows of their own, never read."""
        self.tok.zero_()
        self.pos.zero_()
        self.pos[: len(lengths)] = torch.tensor(lengths, dtype=torch.int32).to(self.engine.model.device)

    def _step(self):
        self.engine.forward(self.tok, self.pos, self.rows, self.blocks, self.cache.k, self.cache.v, None, self.logits)
        self.pos.add_(1)

    def step(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Decode tokens [b] (b <= bucket; the other rows keep theirs; None: every row keeps
        its token); logits [b, vocab], a view of the static buffer (valid until the next step)."""
        b = self.bucket if tokens is None else tokens.shape[0]
        if tokens is not None:
            self.tok[:b].copy_(tokens)
        if not self.graphs:
            self._step()
        elif self.graph is None and self.eager_steps == 0:  # compiles and loads every kernel; a real step
            self.eager_steps += 1
            self._step()
        else:
            if self.graph is None:
                self.graph = capture_graph(self._step, self.engine.model.device)
            self.graph.replay()
        return self.logits[:b]


def capture_graph(fn, device) -> torch.cuda.CUDAGraph:
    """A CUDA graph of fn(), captured with Python's cyclic garbage collector collected first and
    paused during the capture. Garbage of the process (an earlier model, a dropped decoder) may
    hold CUDA graphs; collected during a capture, their destruction is an operation that is not
    permitted while a stream captures, and it invalidates the capture. torch no longer collects
    before a capture by default, so any process (a test suite, a server) could reach this."""
    torch.cuda.synchronize(device)
    gc.collect()
    paused = gc.isenabled()
    gc.disable()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    finally:
        if paused:
            gc.enable()
    return g


class FastLayout:
    """A model's weights laid out for the fast engine (built once, shared by with_backends
    copies): stacked q/k/v and gate/up, the norms, the lm_head, RoPE tables; and the decoders."""

    def __init__(self, model):
        a = model.arch
        lin, d = model.linears, model.dense
        self.layers = []
        for i in range(a.layers):
            p = f"model.layers.{i}."
            qkv_names = (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj")
            gu_names = (p + "mlp.gate_proj", p + "mlp.up_proj")
            layer = {
                "in_norm": d[p + "input_layernorm.weight"].contiguous(),
                "post_norm": d[p + "post_attention_layernorm.weight"].contiguous(),
                "q_norm": d[p + "self_attn.q_norm.weight"].contiguous(),
                "k_norm": d[p + "self_attn.k_norm.weight"].contiguous(),
                "qkv": _stack(lin, list(qkv_names)),
                "o": lin[p + "self_attn.o_proj"],
                "names": {"qkv": qkv_names, "o": (p + "self_attn.o_proj",), "gu": gu_names},
                "down_name": (p + "mlp.down_proj",),
            }
            if _is_moe(a, i):  # a sparse layer: router and experts (runtime/fast_moe.py)
                layer["moe"] = expert_layout(model, i, _stack)
            else:
                layer.update(gu=_stack(lin, list(gu_names)), down=lin[p + "mlp.down_proj"])
            self.layers.append(layer)
        self.moe = any("moe" in w for w in self.layers)  # routes are read on the host: no CUDA graph
        self.final_norm = d["model.norm.weight"].contiguous()
        self.embed = d["model.embed_tokens.weight"]
        self.lm_quantized = "lm_head" in lin
        self.lm_head = lin["lm_head"] if self.lm_quantized else d["lm_head.weight"].contiguous()
        positions = torch.arange(model.max_length, device=model.device)
        cos, sin = rope_tables(positions, a.head_dim, a.rope_theta)  # the reference engine's tables
        self.cos = cos.reshape(model.max_length, a.head_dim).contiguous()
        self.sin = sin.reshape(model.max_length, a.head_dim).contiguous()
        self.decoders: dict = {}


class FastOps:
    """The operations of the fast engine's forward: its Triton kernels. The portable engine
    supplies its own (runtime/portable.py), and runs the same forward."""

    def __init__(self):
        from requant.kernels.triton import attention, dense, fused

        self.add_rms_norm = fused.add_rms_norm
        self.qk_norm_rope = fused.qk_norm_rope
        self.silu_mul_quantize = fused.silu_mul_quantize
        self.dense = dense.dense
        self._attention = attention.attention

    def attention(self, q, k_cache, v_cache, pos, rows, blocks, scale):
        return self._attention(q, k_cache, v_cache, pos, blocks, scale)

    @staticmethod
    def quantize(x):
        # the o_proj input: the Triton quantizer (the same bits as every act backend; no host copies)
        return kernels.quantize_activations(x, backend="triton", check=False)

    @staticmethod
    def scaled_mm(q, w, s, s_w, backend):
        return kernels.scaled_mm(q, w, s, s_w, backend=backend)


class FastEngine:
    """The fast engine of `model` (its backend names are read at each call) over a shared
    FastLayout (built from the model when none is given), running `ops` (default FastOps)."""

    name = "fast"

    def __init__(self, model, layout: FastLayout | None = None, ops=None):
        self.model = model
        self.layout = layout if layout is not None else FastLayout(model)
        self.ops = ops if ops is not None else FastOps()

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        a = self.model.arch
        return KVCache(a.layers, batch, a.kv_heads, capacity, a.head_dim, self.model.device)

    def tokens_per_block(self) -> int:
        """Query tokens one attention program holds (the blocks _run builds)."""
        from requant.kernels.triton.attention import tokens_per_block

        a = self.model.arch
        return tokens_per_block(a.heads, a.kv_heads)

    # -- one forward over packed tokens ------------------------------------------------------
    def forward(self, ids, pos, rows, blocks, k_caches, v_caches, head_rows=None, out=None, capture=None):
        """fp32 logits of the rows head_rows (all when None) of the packed tokens ids [T]:
        pos, rows int32 [T] (position and KV-cache row of each token), blocks int32 [NB, 3]
        (attention programs, see kernels/triton/attention.py). K/V go to the caches."""
        m, lay, ops = self.model, self.layout, self.ops
        a = m.arch
        backend = m.backend
        eps = a.eps
        scale = a.head_dim**-0.5

        def mm(q, s, ws, names):
            if capture is not None:
                capture.record(names, q, s)
            return ops.scaled_mm(q, ws[0], s, ws[1], backend)

        x = lay.embed[ids].to(torch.bfloat16).contiguous()
        delta = None
        for i, w in enumerate(lay.layers):
            _, q8, s8 = ops.add_rms_norm(x, w["in_norm"], eps, delta=delta)
            qkv = mm(q8, s8, w["qkv"], w["names"]["qkv"])
            q = ops.qk_norm_rope(
                qkv, w["q_norm"], w["k_norm"], lay.cos, lay.sin, pos, rows, k_caches[i], v_caches[i],
                a.heads, a.kv_heads, eps,
            )  # fmt: skip
            att = ops.attention(q, k_caches[i], v_caches[i], pos, rows, blocks, scale)
            qa, sa = ops.quantize(att)
            o = mm(qa, sa, w["o"], w["names"]["o"])
            h, q8, s8 = ops.add_rms_norm(x, w["post_norm"], eps, delta=o, write_h="moe" in w)
            if "moe" in w:
                delta = sparse_block(self, w["moe"], h, q8, s8, mm)
                continue
            gu = mm(q8, s8, w["gu"], w["names"]["gu"])
            qm, sm = ops.silu_mul_quantize(gu)
            delta = mm(qm, sm, w["down"], w["down_name"])
        h, q8, s8 = ops.add_rms_norm(
            x, lay.final_norm, eps, delta=delta, quantize=lay.lm_quantized, write_h=not lay.lm_quantized, rows=head_rows
        )
        if lay.lm_quantized:
            logits = mm(q8, s8, lay.lm_head, ("lm_head",)).to(torch.float32)
            if out is not None:
                out.copy_(logits)
                return out
            return logits
        return ops.dense(h, lay.lm_head, out=out)

    # -- packed sequences from the host --------------------------------------------------------
    def _run(self, seqs, k_caches, v_caches, last_only: bool, capture=None) -> torch.Tensor:
        """seqs: (cache row, start position, ids 1-D) per sequence; the ids go to positions
        start.. of that row. Returns fp32 logits [sum n, vocab] (last_only: [len(seqs), vocab])."""
        m = self.model
        per = self.tokens_per_block()
        pos, rows, blocks, last = [], [], [], []
        off = 0
        for row, start, ids in seqs:
            n = len(ids)
            if start + n > m.max_length:  # the RoPE tables end there
                raise ValueError(f"position {start + n - 1} is beyond max_length {m.max_length}")
            pos.extend(range(start, start + n))
            rows.extend([row] * n)
            blocks.extend((off + i, min(per, n - i), row) for i in range(0, n, per))
            off += n
            last.append(off - 1)
        dev = m.device
        ids = torch.cat([s[2].reshape(-1) for s in seqs]).to(dev)
        pos_t = torch.tensor(pos, dtype=torch.int32).to(dev)
        rows_t = torch.tensor(rows, dtype=torch.int32).to(dev)
        blocks_t = torch.tensor(blocks, dtype=torch.int32).reshape(-1, 3).to(dev)
        head_rows = None
        if last_only and len(last) != off:  # every sequence one token: all rows already
            head_rows = torch.tensor(last, dtype=torch.int32).to(dev)
        return self.forward(ids, pos_t, rows_t, blocks_t, k_caches, v_caches, head_rows, capture=capture)

    def prefill(self, prompts, cache: KVCache | None = None, capture=None, last_only: bool = False) -> torch.Tensor:
        a = self.model.arch
        if cache is None:  # one layer's scratch K/V, reused by every layer (nothing is kept)
            cap = 1 << max(max(len(p) for p in prompts) - 1, 0).bit_length()
            shape = (len(prompts), a.kv_heads, cap, a.head_dim)
            k = torch.empty(shape, dtype=torch.bfloat16, device=self.model.device)
            v = torch.empty(shape, dtype=torch.bfloat16, device=self.model.device)
            kc, vc = [k] * a.layers, [v] * a.layers
        else:
            kc, vc = cache.k, cache.v
        out = self._run([(j, 0, p) for j, p in enumerate(prompts)], kc, vc, last_only, capture)
        if cache is not None:
            cache.lengths[: len(prompts)] = [len(p) for p in prompts]
        return out

    def extend(self, chunks, cache: KVCache) -> torch.Tensor:
        """Append chunk j to row j of the cache (after its cached positions); logits of every
        chunk token [sum n, vocab], the same bits as prefilling the whole sequence. Empty
        chunks are skipped."""
        seqs = [(j, cache.lengths[j], c) for j, c in enumerate(chunks) if len(c)]
        top = max(cache.lengths[j] + len(c) for j, c in enumerate(chunks))
        if top > cache.capacity:
            raise ValueError(f"KV cache full: {top} positions > capacity {cache.capacity}")
        out = self._run(seqs, cache.k, cache.v, last_only=False)
        for j, c in enumerate(chunks):
            cache.lengths[j] += len(c)
        return out

    def decode_step(self, tokens: torch.Tensor, cache: KVCache, capture=None) -> torch.Tensor:
        longest = max(cache.lengths) + 1
        if longest > cache.capacity:
            raise ValueError(f"KV cache full: {longest} positions > capacity {cache.capacity}")
        tokens = tokens.reshape(-1)
        seqs = [(j, cache.lengths[j], tokens[j : j + 1]) for j in range(len(cache.lengths))]
        out = self._run(seqs, cache.k, cache.v, last_only=True, capture=capture)
        cache.lengths = [n + 1 for n in cache.lengths]
        return out

    # -- decoding ------------------------------------------------------------------------------
    def decoder(self, batch: int, capacity: int, graphs: bool) -> _Decoder:
        """The decoder of `batch` rows (padded to its bucket; larger batches at their
        exact size), capacity and graphs for the current backends: built, or the one kept (the
        last _KEEP_DECODERS are kept, most recent last)."""
        bucket = next((k for k in BUCKETS if k >= batch), batch)
        m, decoders = self.model, self.layout.decoders
        key = (bucket, capacity, m.backend, m.act_backend, graphs)
        dec = decoders.pop(key, None)
        if dec is None:
            while len(decoders) >= _KEEP_DECODERS:
                decoders.pop(next(iter(decoders)))
            dec = _Decoder(self, bucket, capacity, graphs)
        dec.engine = self
        decoders[key] = dec  # most recent last
        return dec
