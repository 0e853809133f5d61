"""The runtime's fast path: fused Triton kernels, one attention for prefill and decode, a
bf16 lm_head with one fixed tile, and decode steps replayed from CUDA graphs.

Model(engine="fast") routes prefill / decode_step / logits / generate here (engine="auto"
picks it on CUDA for W8A8 checkpoints; see requant/runtime/__init__.py). The reference path
(ops.py, Model._layer) stays the CPU oracle and serves the audit's capture.

One decoder layer, T packed tokens (every quantized GEMM is kernels.scaled_mm by backend name;
q/k/v and gate/up are one GEMM each over their weights stacked along N, which gives the same
bits as separate GEMMs: every output element is its own exact int32 dot product and epilogue):
    add_rms_norm(x, input_layernorm, delta = previous down_proj)  -> x += delta; q8, s8
    qkv  = scaled_mm(q8, [Wq; Wk; Wv])
    q    = qk_norm_rope(qkv)  (k and v written to the KV cache at each token's (row, position))
    attn = attention(q, cache)                       kernels/triton/attention.py
    o    = scaled_mm(quantize_activations(attn), Wo)
    add_rms_norm(x, post_attention_layernorm, delta = o) -> x += o; q8, s8
    gu   = scaled_mm(q8, [Wgate; Wup]);  q8, s8 = silu_mul_quantize(gu);  delta = scaled_mm(q8, Wdown)
then add_rms_norm(x, model.norm, delta) and the lm_head (kernels/triton/dense.py, or
scaled_mm when the checkpoint quantizes it). The numerics of each kernel are in its module
docstring (kernels/triton/fused.py, attention.py, dense.py).

INVARIANCE. Every kernel works per row with a configuration that depends on the model's
shapes only (never on the number of tokens), the int8 GEMMs are exact, and attention reads
K/V from the cache with one tile walk for all modes. So a token's logits are the same bits
whether it is prefilled with its whole prompt, in chunks after a cached prefix (`extend`),
or decoded, and whatever else is in the batch; a CUDA graph replays the same kernels on
static buffers (positions and walk bounds are read from device memory), so graph == eager.

CUDA graphs (generate(graphs=True), the default on CUDA): the batch is padded to a bucket
(1, 2, 4, ..., 64; larger batches run eagerly with their exact size); padded rows decode
token 0 from position 0 in rows of the cache of their own and are never read back. The first
decode step of a (bucket, capacity, backends) runs eagerly, then the step is captured and
replayed; the last two such decoders (cache and graph) are kept for the next call.
"""

from __future__ import annotations

import torch

from requant import kernels
from requant.qwen3 import LAYER_LINEARS
from requant.runtime.ops import rope_tables

__all__ = ["BUCKETS", "FastWeights", "fast_supported"]

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
_KEEP_DECODERS = 2


def fast_supported(model) -> str | None:
    """Why `model` cannot run the fast path (None when it can)."""
    a = model.arch
    for i in range(a.layers):
        for n in LAYER_LINEARS:
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
    """Static buffers, a KV cache and (once captured) the CUDA graph of one decode step."""

    def __init__(self, fw, model, bucket: int, capacity: int, graphs: bool):
        dev = model.device
        self.bucket = bucket
        self.cache = model.new_cache(bucket, capacity)
        self.tok = torch.zeros(bucket, dtype=torch.long, device=dev)
        self.pos = torch.zeros(bucket, dtype=torch.int32, device=dev)
        self.rows = torch.arange(bucket, dtype=torch.int32, device=dev)
        self.blocks = torch.stack([self.rows, torch.ones_like(self.rows), self.rows], 1).contiguous()
        self.logits = torch.empty(bucket, model.arch.vocab, dtype=torch.float32, device=dev)
        self.next = torch.zeros(bucket, dtype=torch.long, device=dev)
        self.fw = fw
        self.model = model
        self.graphs = graphs and dev.type == "cuda"
        self.graph = None
        self.eager_steps = 0

    def _step(self):
        fw, m = self.fw, self.model
        fw.forward(
            m,
            self.tok,
            self.pos,
            self.rows,
            self.blocks,
            self.cache.k,
            self.cache.v,
            None,
            self.logits,
        )
        self.next.copy_(torch.argmax(self.logits, dim=-1))
        self.tok.copy_(self.next)
        self.pos.add_(1)

    def step(self):
        if not self.graphs:
            self._step()
            return
        if self.graph is None:
            if self.eager_steps == 0:  # compiles and loads every kernel; a real step, same code
                self.eager_steps += 1
                self._step()
                return
            torch.cuda.synchronize(self.model.device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._step()
            self.graph = g
        self.graph.replay()


class FastWeights:
    """A model's weights laid out for the fast path (built once per Model and its
    with_backends copies): stacked q/k/v and gate/up, the norms, the lm_head, RoPE tables."""

    def __init__(self, model):
        a = model.arch
        lin, d = model.linears, model.dense
        self.layers = []
        for i in range(a.layers):
            p = f"model.layers.{i}."
            qkv = _stack(
                lin,
                [
                    p + "self_attn.q_proj",
                    p + "self_attn.k_proj",
                    p + "self_attn.v_proj",
                ],
            )
            gu = _stack(lin, [p + "mlp.gate_proj", p + "mlp.up_proj"])
            self.layers.append(
                {
                    "in_norm": d[p + "input_layernorm.weight"].contiguous(),
                    "post_norm": d[p + "post_attention_layernorm.weight"].contiguous(),
                    "q_norm": d[p + "self_attn.q_norm.weight"].contiguous(),
                    "k_norm": d[p + "self_attn.k_norm.weight"].contiguous(),
                    "qkv": qkv,
                    "o": lin[p + "self_attn.o_proj"],
                    "gu": gu,
                    "down": lin[p + "mlp.down_proj"],
                }
            )
        self.final_norm = d["model.norm.weight"].contiguous()
        self.embed = d["model.embed_tokens.weight"]
        self.lm_quantized = "lm_head" in lin
        self.lm_head = lin["lm_head"] if self.lm_quantized else d["lm_head.weight"].contiguous()
        positions = torch.arange(model.max_length, device=model.device)
        cos, sin = rope_tables(positions, a.head_dim, a.rope_theta)  # the reference path's tables
        self.cos = cos.reshape(model.max_length, a.head_dim).contiguous()
        self.sin = sin.reshape(model.max_length, a.head_dim).contiguous()
        self.decoders: dict = {}

    # -- one forward over packed tokens ------------------------------------------------------
    def forward(
        self,
        model,
        ids,
        pos,
        rows,
        blocks,
        k_caches,
        v_caches,
        head_rows=None,
        out=None,
    ) -> torch.Tensor:
        """fp32 logits of the rows head_rows (all when None) of the packed tokens ids [T]:
        pos, rows int32 [T] (position and KV-cache row of each token), blocks int32 [NB, 3]
        (attention programs, see kernels/triton/attention.py). K/V go to the caches."""
        from requant.kernels.triton.attention import attention
        from requant.kernels.triton.dense import dense
        from requant.kernels.triton.fused import (
            add_rms_norm,
            qk_norm_rope,
            silu_mul_quantize,
        )

        a = model.arch
        be = model.backend
        act = "triton"  # the o_proj input: the Triton quantizer (the same bits as every backend; no host copies)
        eps = a.eps
        scale = a.head_dim**-0.5
        x = self.embed[ids].to(torch.bfloat16).contiguous()
        delta = None
        for i, w in enumerate(self.layers):
            _, q8, s8 = add_rms_norm(x, w["in_norm"], eps, delta=delta)
            qkv = kernels.scaled_mm(q8, w["qkv"][0], s8, w["qkv"][1], backend=be)
            q = qk_norm_rope(
                qkv,
                w["q_norm"],
                w["k_norm"],
                self.cos,
                self.sin,
                pos,
                rows,
                k_caches[i],
                v_caches[i],
                a.heads,
                a.kv_heads,
                eps,
            )
            att = attention(q, k_caches[i], v_caches[i], pos, blocks, scale)
            qa, sa = kernels.quantize_activations(att, backend=act, check=False)
            o = kernels.scaled_mm(qa, w["o"][0], sa, w["o"][1], backend=be)
            _, q8, s8 = add_rms_norm(x, w["post_norm"], eps, delta=o)
            gu = kernels.scaled_mm(q8, w["gu"][0], s8, w["gu"][1], backend=be)
            qm, sm = silu_mul_quantize(gu)
            delta = kernels.scaled_mm(qm, w["down"][0], sm, w["down"][1], backend=be)
        h, q8, s8 = add_rms_norm(
            x,
            self.final_norm,
            eps,
            delta=delta,
            quantize=self.lm_quantized,
            write_h=not self.lm_quantized,
            rows=head_rows,
        )
        if self.lm_quantized:
            logits = kernels.scaled_mm(q8, self.lm_head[0], s8, self.lm_head[1], backend=be).to(torch.float32)
            if out is not None:
                out.copy_(logits)
                return out
            return logits
        return dense(h, self.lm_head, out=out)

    # -- packed sequences from the host --------------------------------------------------------
    def run(self, model, seqs, k_caches, v_caches, last_only: bool) -> torch.Tensor:
        """seqs: (cache row, start position, ids 1-D) per sequence; the ids go to positions
        start.. of that row. Returns fp32 logits [sum n, vocab] (last_only: [len(seqs), vocab])."""
        from requant.kernels.triton.attention import tokens_per_block

        a = model.arch
        per = tokens_per_block(a.heads, a.kv_heads)
        pos, rows, blocks, last = [], [], [], []
        off = 0
        for row, start, ids in seqs:
            n = len(ids)
            if start + n > model.max_length:  # the RoPE tables end there
                raise ValueError(f"position {start + n - 1} is beyond max_length {model.max_length}")
            pos.extend(range(start, start + n))
            rows.extend([row] * n)
            blocks.extend((off + i, min(per, n - i), row) for i in range(0, n, per))
            off += n
            last.append(off - 1)
        dev = model.device
        ids = torch.cat([s[2].reshape(-1) for s in seqs]).to(dev)
        pos_t = torch.tensor(pos, dtype=torch.int32).to(dev)
        rows_t = torch.tensor(rows, dtype=torch.int32).to(dev)
        blocks_t = torch.tensor(blocks, dtype=torch.int32).reshape(-1, 3).to(dev)
        head_rows = None
        if last_only and len(last) != off:  # every sequence one token: all rows already
            head_rows = torch.tensor(last, dtype=torch.int32).to(dev)
        return self.forward(model, ids, pos_t, rows_t, blocks_t, k_caches, v_caches, head_rows)

    def prefill(self, model, prompts, cache=None, last_only: bool = False) -> torch.Tensor:
        a = model.arch
        if cache is None:  # one layer's scratch K/V, reused by every layer (nothing is kept)
            cap = 1 << max(max(len(p) for p in prompts) - 1, 0).bit_length()
            shape = (len(prompts), a.kv_heads, cap, a.head_dim)
            k = torch.empty(shape, dtype=torch.bfloat16, device=model.device)
            v = torch.empty(shape, dtype=torch.bfloat16, device=model.device)
            kc, vc = [k] * a.layers, [v] * a.layers
        else:
            kc, vc = cache.k, cache.v
        out = self.run(model, [(j, 0, p) for j, p in enumerate(prompts)], kc, vc, last_only)
        if cache is not None:
            cache.lengths[: len(prompts)] = [len(p) for p in prompts]
        return out

    def extend(self, model, chunks, cache) -> torch.Tensor:
        """Append chunk j to row j of the cache (after its cached positions); logits of every
        chunk token [sum n, vocab]. Empty chunks are skipped."""
        seqs = [(j, cache.lengths[j], c) for j, c in enumerate(chunks) if len(c)]
        top = max(cache.lengths[j] + len(c) for j, c in enumerate(chunks))
        if top > cache.capacity:
            raise ValueError(f"KV cache full: {top} positions > capacity {cache.capacity}")
        out = self.run(model, seqs, cache.k, cache.v, last_only=False)
        for j, c in enumerate(chunks):
            cache.lengths[j] += len(c)
        return out

    def decode_step(self, model, tokens, cache) -> torch.Tensor:
        longest = max(cache.lengths) + 1
        if longest > cache.capacity:
            raise ValueError(f"KV cache full: {longest} positions > capacity {cache.capacity}")
        tokens = tokens.reshape(-1)
        seqs = [(j, cache.lengths[j], tokens[j : j + 1]) for j in range(len(cache.lengths))]
        out = self.run(model, seqs, cache.k, cache.v, last_only=True)
        cache.lengths = [n + 1 for n in cache.lengths]
        return out

    # -- greedy decoding -----------------------------------------------------------------------
    def _decoder(self, model, bucket: int, capacity: int, graphs: bool) -> _Decoder:
        key = (bucket, capacity, model.backend, model.act_backend, graphs)
        dec = self.decoders.pop(key, None)
        if dec is None:
            while len(self.decoders) >= _KEEP_DECODERS:
                self.decoders.pop(next(iter(self.decoders)))
            dec = _Decoder(self, model, bucket, capacity, graphs)
        dec.model = model
        self.decoders[key] = dec  # most recent last
        return dec

    def generate(
        self,
        model,
        tensors,
        max_new_tokens: int,
        eos: set,
        keep_logits: bool,
        graphs: bool,
        choose=None,
    ):
        from requant.runtime.model import Generation, pow2_at_least

        b = len(tensors)
        gen = Generation([[] for _ in tensors])
        bucket = next((k for k in BUCKETS if k >= b), b)
        cap = pow2_at_least(max(len(t) for t in tensors) + max_new_tokens)
        dec = self._decoder(model, bucket, cap, graphs)
        logits = self.prefill(model, tensors, cache=dec.cache, last_only=True)
        first = torch.argmax(logits, dim=-1) if choose is None else choose(0, logits).to(model.device, torch.long)
        dec.tok.zero_()
        dec.tok[:b] = first
        dec.pos.zero_()
        dec.pos[:b] = torch.tensor([len(t) for t in tensors], dtype=torch.int32).to(model.device)
        steps_ids = [first]
        steps_logits = [logits] if keep_logits else []
        for step in range(1, max_new_tokens):
            if eos and step % 16 == 0 and _all_done(steps_ids, eos):
                break
            dec.step()
            if choose is not None:  # after the graph: its argmax into dec.tok is overwritten for the real rows
                dec.tok[:b] = choose(step, dec.logits[:b]).to(model.device, torch.long)
                steps_ids.append(dec.tok[:b].clone())
            else:
                steps_ids.append(dec.next[:b].clone())
            if keep_logits:
                steps_logits.append(dec.logits[:b].clone())
        ids = torch.stack(steps_ids, 1).tolist()  # [B, steps]
        # what the reference loop emits: each sequence up to its first eos; steps until all are done
        n_steps = 0
        for j, row in enumerate(ids):
            for tok in row:
                gen.ids[j].append(tok)
                if tok in eos:
                    break
            n_steps = max(n_steps, len(gen.ids[j]))
        if keep_logits:
            gen.step_logits = steps_logits[:n_steps]
        return gen


def _all_done(steps_ids, eos) -> bool:
    ids = torch.stack(steps_ids, 1).tolist()
    return all(any(t in eos for t in row) for row in ids)
