"""The per-rank forward of a tensor-parallel Qwen3 W8A8 model on torch.distributed.

    comm = Comm(group)                         # a process group of tp ranks (None: one rank)
    m = ShardedModel.build(config, dense, linears, comm, backend="reference-triton-order")
    m.logits(prompts)                          # fp32 [T_i, vocab] per prompt, on every rank
    m.generate(prompts, max_new_tokens=16)     # (new ids per prompt, fp32 [B, vocab] per step)

Every op but the split Linears is requant.runtime's (ops.rms_norm, apply_rope, rope_tables,
attend_prompt, attend_decode, dense_rows; imported), in the same order as its Model, so that
TP 1 here is the runtime's reference-engine forward bit for bit on the CPU (tested; on a GPU the fixed
call shapes below may pick other cuBLAS kernels than the runtime's batched ones). Sharding: requant/tp/shard.py.

NUMERICS (reduce="int32", the default: every TP degree gives the TP-1 bits).
  Column-parallel Linears (q/k/v, gate/up, lm_head): the replicated input is quantized
  whole, exactly as on one rank (kernels.quantize_activations), and the registered
  scaled_mm backend runs on this rank's weight rows. An output element reads one weight
  row, its scale and the input row only (exact int32 accumulation, elementwise epilogue),
  so each rank's outputs are a slice of the unsharded outputs, bit for bit. lm_head's
  slices are all-gathered (a copy, no arithmetic).
  Row-parallel Linears (o_proj, down_proj), on a K-slice of the input:
    absmax = MAX all-reduce over ranks of the local per-token absmax   (max is exact)
    (q, s) = kernels.epilogue.quantize_slice(x_local, absmax)          (the registered quantizer)
    acc    = SUM all-reduce, in int32, of kernels.epilogue.int_mm(q, w_local)
    y      = apply_epilogue(acc, s, s_w, order of the backend)         (once, on the full sum)
  Why the appended column: per-token quantization is an elementwise function of x and its
  row's absmax, so giving each shard one extra element equal to the global absmax makes
  the backend's own quantizer produce the unsharded row's s and q on every shard (the
  extra column, which changes nothing else, is dropped). Why a MAX all-reduce and not
  "quantize once, then scatter": the row-parallel input exists only as shards (attention
  heads, intermediate channels); quantizing it whole would need an all-gather of
  [T, K] bf16 per Linear, the traffic tensor parallelism avoids, where this sends [T, 1]
  fp32. The int32 SUM is exact and associative (|acc| < 2**31, kernels.reference.MAX_K),
  so gloo's or NCCL's algorithm, channel count and the degree cannot change it.
  A row-parallel Linear the checkpoint does not quantize is computed whole on every rank
  from the all-gathered input (dense_rows; exact by the same replication argument).
reduce="bf16" (the usual scheme, for contrast): the same global-absmax quantization, then
  each rank's scaled_mm gives bf16 partial outputs, which are SUM all-reduced in bf16: each
  partial is rounded to bf16 and the sum is rounded again, in the collective's order, so a
  result may differ from TP 1 by bf16 spacings (measured by `requant tp-check`). (vLLM and
  SGLang also quantize each shard with its own local scale; that is not done here, so the
  reduction is the only difference.)

INVARIANCE. By construction: the column-parallel slices and the int32 row-parallel sums
(above), attention (each head reads only its own q, k, v; attend_decode is elementwise
plus tree sums per head), everything replicated (norms, RoPE, residual adds, the
embedding) since every rank holds the same residual stream (the collectives hand every rank
the same result: exactly for MAX and int32 SUM; for the bf16 SUM because a ring or tree
all-reduce reduces each element once and broadcasts it). By a fixed call shape, so that
the BLAS library (cuBLAS picks kernels, split-K included, from the shapes; measured on an
H200: batched heads at TP 4 changed 27 prefill logits) runs the same kernel at every degree:
prefill attention runs one query head per call ([1, T, D] GEMMs whatever H/tp is), and a
dense (unquantized) Linear runs in zero-padded [64, K] x [K, COL_CHUNK] blocks
(dense_cols: dense_rows' row blocks, and fixed column blocks, whatever N/tp is). That a
row or column inside one such call does not depend on the others is how GEMM kernels work;
the tests and `requant tp-check` check it, bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from requant import kernels
from requant.kernels.epilogue import apply_epilogue, int_mm, order_of, quantize_slice
from requant.qwen3 import Qwen3Arch
from requant.runtime.model import KVCache, decode_attention, pow2_at_least
from requant.runtime.ops import (
    apply_rope,
    attend_prompt,
    dense_rows,
    rms_norm,
    rope_tables,
)
from requant.runtime.weights import arch_from_config
from requant.tp.shard import Plan, plan, shard

__all__ = ["REDUCES", "Comm", "ShardedModel"]

REDUCES = ("int32", "bf16")


class Comm:
    """The collectives of one tensor-parallel group (None: a single rank, no communication)."""

    def __init__(self, group=None):
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)

    def all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, op=op, group=self.group)
        return t

    def all_gather_cols(self, t: torch.Tensor) -> torch.Tensor:
        """[M, n] per rank -> [M, size * n], rank order along the last dim."""
        if self.size == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


COL_CHUNK = 2048  # columns per dense GEMM call (see INVARIANCE)


def pad_rows(w32: torch.Tensor, chunk: int = COL_CHUNK) -> torch.Tensor:
    """w32 with zero rows appended up to a multiple of `chunk` (done once per weight)."""
    extra = -w32.shape[0] % chunk
    return torch.cat([w32, w32.new_zeros(extra, w32.shape[1])]) if extra else w32


def dense_cols(x: torch.Tensor, w32: torch.Tensor, n: int | None = None, chunk: int = COL_CHUNK) -> torch.Tensor:
    """bf16(fp32(x) @ w32[:n]^T) in calls of exactly `chunk` weight rows (w32 zero-padded to a
    multiple of chunk, see pad_rows): every column goes through a GEMM of one shape,
    whatever N is."""
    n = w32.shape[0] if n is None else n
    w32 = pad_rows(w32, chunk)
    return torch.cat([dense_rows(x, w32[j : j + chunk]) for j in range(0, w32.shape[0], chunk)], dim=1)[:, :n]


def attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """attend_prompt one query head at a time: q [T, H, D], k, v [T, KV, D] -> bf16 [T, H*D]."""
    group = q.shape[1] // k.shape[1]
    return torch.cat(
        [
            attend_prompt(q[:, h : h + 1], k[:, h // group : h // group + 1], v[:, h // group : h // group + 1], scale)
            for h in range(q.shape[1])
        ],
        dim=1,
    )


class ShardedModel:
    """One rank's part of a tensor-parallel Qwen3 (see the module docstring)."""

    def __init__(
        self,
        arch: Qwen3Arch,
        p: Plan,
        dense: dict[str, torch.Tensor],
        linears: dict[str, tuple[torch.Tensor, torch.Tensor]],
        comm: Comm,
        *,
        backend: str = "reference-triton-order",
        act_backend: str = "reference",
        reduce: str = "int32",
        reduction: str = "auto",
    ):
        if reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {', '.join(REDUCES)}, got {reduce!r}")
        if reduction not in ("auto", "torch", "tree"):
            raise ValueError(f"reduction must be auto, torch or tree, got {reduction!r}")
        self.arch, self.plan, self.dense, self.linears, self.comm = arch, p, dense, linears, comm
        self.backend, self.act_backend, self.reduce = backend, act_backend, reduce
        self.order = order_of(backend)
        self.device = dense["model.embed_tokens.weight"].device
        self.tree = reduction == "tree" or (reduction == "auto" and self.device.type != "cpu")
        self._fp32: dict[str, torch.Tensor] = {}

    @classmethod
    def build(
        cls,
        config: dict,
        dense: dict[str, torch.Tensor],
        linears: dict[str, tuple[torch.Tensor, torch.Tensor]],
        comm: Comm,
        device=None,
        **kw,
    ) -> ShardedModel:
        """This rank's model from the whole model's tensors (requant.runtime.load_dense and
        load_linears; not modified), moved to device (default: where they are)."""
        arch = arch_from_config(config)
        p = plan(arch, comm.size, comm.rank)
        d, lin = shard(dense, linears, arch, p)
        if device is not None:
            d = {k: t.to(device) for k, t in d.items()}
            lin = {k: (w.to(device), s.to(device)) for k, (w, s) in lin.items()}
        return cls(arch, p, d, lin, comm, **kw)

    # -- the split Linears ----------------------------------------------------------------
    def _dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """A dense Linear on this rank's weight rows (dense_cols; the fp32 copy, padded once)."""
        w = self._fp32.get(name)
        if w is None:
            w = self._fp32[name] = pad_rows(self.dense[name + ".weight"].to(torch.float32))
        return dense_cols(x, w, self.dense[name + ".weight"].shape[0])

    def _column(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        """Column-parallel Linears sharing the replicated input x (quantized once, whole)."""
        if any(n in self.linears for n in names):
            q, s = kernels.quantize_activations(x, backend=self.act_backend)
        outs = []
        for n in names:
            if n in self.linears:
                w, s_w = self.linears[n]
                outs.append(kernels.scaled_mm(q, w, s, s_w, backend=self.backend))
            else:
                outs.append(self._dense(x, n))
        return outs

    def _quantize_global(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token int8 of a K-slice x with the scale of the whole row (module docstring)."""
        if self.comm.size == 1:
            return kernels.quantize_activations(x, backend=self.act_backend)
        amax = x.abs().amax(dim=1, keepdim=True).to(torch.float32)  # exact: |bf16| and max
        self.comm.all_reduce(amax, dist.ReduceOp.MAX)
        return quantize_slice(x, amax, backend=self.act_backend)

    def _row(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Row-parallel Linear on this rank's K-slice x; the full output on every rank."""
        if name not in self.linears:
            return self._dense(self.comm.all_gather_cols(x), name)
        w, s_w = self.linears[name]
        q, s = self._quantize_global(x)
        if self.reduce == "int32":
            acc = self.comm.all_reduce(int_mm(q, w), dist.ReduceOp.SUM)
            return apply_epilogue(acc, s, s_w, self.order)
        return self.comm.all_reduce(kernels.scaled_mm(q, w, s, s_w, backend=self.backend), dist.ReduceOp.SUM)

    # -- the forward (requant.runtime.model's order of ops) ---------------------------------
    def _norm(self, x, w):
        return rms_norm(x, w, self.arch.eps, tree=self.tree)

    def _layer(self, i: int, x: torch.Tensor, cos, sin, attend) -> torch.Tensor:
        a, d, p = self.arch, self.dense, f"model.layers.{i}."
        hl, kvl = self.plan.local_heads, self.plan.local_kv_heads
        t = x.shape[0]
        h = self._norm(x, d[p + "input_layernorm.weight"])
        q, k, v = self._column(h, (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"))
        q = apply_rope(self._norm(q.view(t, hl, a.head_dim), d[p + "self_attn.q_norm.weight"]), cos, sin)
        k = apply_rope(self._norm(k.view(t, kvl, a.head_dim), d[p + "self_attn.k_norm.weight"]), cos, sin)
        attn = attend(i, q, k, v.view(t, kvl, a.head_dim))
        x = x + self._row(attn, p + "self_attn.o_proj")
        h = self._norm(x, d[p + "post_attention_layernorm.weight"])
        gate, up = self._column(h, (p + "mlp.gate_proj", p + "mlp.up_proj"))
        act = (torch.nn.functional.silu(gate.to(torch.float32)) * up.to(torch.float32)).to(torch.bfloat16)
        return x + self._row(act, p + "mlp.down_proj")

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        x = self._norm(x, self.dense["model.norm.weight"])
        (local,) = self._column(x, ("lm_head",))
        return self.comm.all_gather_cols(local).to(torch.float32)

    def prefill(
        self, prompts: list[torch.Tensor], cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        a, dev = self.arch, self.device
        lens = [len(t) for t in prompts]
        bounds, s = [], 0
        for n in lens:
            bounds.append((s, s + n))
            s += n
        ids = torch.cat(prompts).to(dev)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        cos, sin = rope_tables(pos, a.head_dim, a.rope_theta)
        scale = a.head_dim**-0.5

        def attend(i, q, k, v):
            if cache is not None:
                for j, (lo, hi) in enumerate(bounds):
                    cache.k[i][j, :, : hi - lo] = k[lo:hi].transpose(0, 1)
                    cache.v[i][j, :, : hi - lo] = v[lo:hi].transpose(0, 1)
            return torch.cat([attend_heads(q[lo:hi], k[lo:hi], v[lo:hi], scale) for lo, hi in bounds])

        x = self.dense["model.embed_tokens.weight"][ids].to(torch.bfloat16)
        for i in range(a.layers):
            x = self._layer(i, x, cos, sin, attend)
        if cache is not None:
            cache.lengths = list(lens)
        if last_only:
            x = x[torch.tensor([hi - 1 for _, hi in bounds], device=dev)]
        return self._head(x)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        a, dev = self.arch, self.device
        cos, sin, attend = decode_attention(cache, a, dev)  # the runtime's decode attention, on this rank's heads
        x = self.dense["model.embed_tokens.weight"][tokens.to(dev)].to(torch.bfloat16)
        for i in range(a.layers):
            x = self._layer(i, x, cos, sin, attend)
        cache.lengths = [n + 1 for n in cache.lengths]
        return self._head(x)

    # -- the API ---------------------------------------------------------------------------
    @staticmethod
    def _tensors(prompts) -> list[torch.Tensor]:
        if not prompts:
            raise ValueError("prompts must be a non-empty list of token id lists")
        out = [torch.as_tensor(list(p), dtype=torch.long) for p in prompts]
        if any(t.numel() == 0 for t in out):
            raise ValueError("a prompt is empty")
        return out

    def logits(self, prompts) -> list[torch.Tensor]:
        """Prefill: fp32 logits [T_i, vocab] per prompt (every rank holds all of them)."""
        tensors = self._tensors(prompts)
        with torch.no_grad():
            flat = self.prefill(tensors)
        return list(torch.split(flat, [len(t) for t in tensors]))

    def new_cache(self, batch: int, positions: int) -> KVCache:
        """An empty KV cache of this rank's KV heads for `positions` (rounded up to a power of two)."""
        return KVCache(
            self.arch.layers,
            batch,
            self.plan.local_kv_heads,
            pow2_at_least(positions),
            self.arch.head_dim,
            self.device,
        )

    def generate(self, prompts, max_new_tokens: int) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Greedy decoding with a KV cache (no stop token): the new ids per prompt and the
        fp32 logits [B, vocab] each step's tokens were chosen from (ties: the lowest id)."""
        tensors = self._tensors(prompts)
        ids: list[list[int]] = [[] for _ in tensors]
        steps: list[torch.Tensor] = []
        if max_new_tokens <= 0:
            return ids, steps
        cache = self.new_cache(len(tensors), max(len(t) for t in tensors) + max_new_tokens)
        with torch.no_grad():
            logits = self.prefill(tensors, cache=cache, last_only=True)
            for step in range(max_new_tokens):
                nxt = torch.argmax(logits, dim=-1)
                steps.append(logits)
                for j, tok in enumerate(nxt.tolist()):
                    ids[j].append(tok)
                if step == max_new_tokens - 1:
                    break
                logits = self.decode_step(nxt, cache)
        return ids, steps
