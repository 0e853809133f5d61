"""The per-rank forward of a tensor-parallel Qwen3 W8A8 model on torch.distributed.

    comm = Comm(group)                         # a process group of tp ranks (None: one rank)
    m = ShardedModel.build(config, dense, linears, comm, backend="reference-triton-order")
    m.logits(prompts)                          # fp32 [T_i, vocab] per prompt, on every rank
    m.generate(prompts, max_new_tokens=16)     # a requant.runtime Generation (ids, step logits)

The reference engine (its layer, prefill and decode_step) and the one decode loop
(requant/runtime/engine.py) run on each rank, with this module's Linears (`ShardedLinears`) and a
prompt attention of one query head per call (`attend_heads`). Contract (reduce="int32", the
default): every TP degree gives the TP-1 bits, and TP 1 is the reference engine's forward bit for
bit on the CPU (tested on gloo). The proof: docs/tensor-parallel.md#numerics-requanttpenginepy-kernelsepiloguepy.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from requant import kernels
from requant.kernels.epilogue import apply_epilogue, int_mm, order_of, quantize_slice
from requant.kernels.ops import attend_prompt, dense_rows
from requant.models.qwen3 import Qwen3Arch
from requant.runtime.cache import Generation, KVCache
from requant.runtime.engine import generate
from requant.runtime.reference import DeviceLinears, ReferenceEngine
from requant.runtime.weights import arch_from_config
from requant.tp.shard import Plan, plan, shard

__all__ = ["COL_CHUNK", "REDUCES", "Comm", "ShardedLinears", "ShardedModel", "attend_heads", "dense_cols"]

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


COL_CHUNK = 2048  # columns per dense GEMM call (docs/tensor-parallel.md: one call shape at every degree)


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


class ShardedLinears(DeviceLinears):
    """The Linears of one rank: the reference engine's Linear strategy (DeviceLinears, whose
    column() this reuses: column-parallel Linears on the replicated input, quantized once,
    whole), with dense Linears on this rank's weight rows and the row-parallel all-reduce."""

    def __init__(self, m: ShardedModel):
        super().__init__(m)
        self.m = m

    def dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """A dense Linear on this rank's weight rows (dense_cols; the fp32 copy, padded once)."""
        m = self.m
        w = m._fp32.get(name)
        if w is None:
            w = m._fp32[name] = pad_rows(m.dense[name + ".weight"].to(torch.float32))
        return dense_cols(x, w, m.dense[name + ".weight"].shape[0])

    def column(self, x: torch.Tensor, names: tuple[str, ...], capture=None) -> list[torch.Tensor]:
        if capture is not None:
            raise ValueError("capture runs on one device (requant.runtime), not under tensor parallelism")
        return super().column(x, names, None)

    def _quantize_global(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token int8 of a K-slice x with the scale of the whole row (docs/tensor-parallel.md)."""
        m = self.m
        if m.comm.size == 1:
            return kernels.quantize_activations(x, backend=m.act_backend)
        amax = x.abs().amax(dim=1, keepdim=True).to(torch.float32)  # exact: |bf16| and max
        m.comm.all_reduce(amax, dist.ReduceOp.MAX)
        return quantize_slice(x, amax, backend=m.act_backend)

    def row(self, x: torch.Tensor, name: str, capture=None) -> torch.Tensor:
        """Row-parallel Linear on this rank's K-slice x; the full output on every rank."""
        m = self.m
        if name not in m.linears:
            return self.dense(m.comm.all_gather_cols(x), name)
        w, s_w = m.linears[name]
        q, s = self._quantize_global(x)
        if m.reduce == "int32":
            acc = m.comm.all_reduce(int_mm(q, w), dist.ReduceOp.SUM)
            return apply_epilogue(acc, s, s_w, m.order)
        return m.comm.all_reduce(kernels.scaled_mm(q, w, s, s_w, backend=m.backend), dist.ReduceOp.SUM)

    def head(self, x: torch.Tensor, capture=None) -> torch.Tensor:
        (local,) = self.column(x, ("lm_head",), capture)
        return self.m.comm.all_gather_cols(local).to(torch.float32)


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
        self.impl = ReferenceEngine(
            self,
            linears=ShardedLinears(self),
            heads=p.local_heads,
            kv_heads=p.local_kv_heads,
            prompt_attention=attend_heads,
        )

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

    # -- the reference engine's methods, on this rank ----------------------------------------
    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache of this rank's KV heads holding exactly `capacity` positions."""
        return self.impl.new_cache(batch, capacity)

    def prefill(
        self, prompts: list[torch.Tensor], cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        return self.impl.prefill(prompts, cache=cache, last_only=last_only)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return self.impl.decode_step(tokens, cache)

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

    def generate(self, prompts, max_new_tokens: int, eos_id=None, keep_logits: bool = True, choose=None) -> Generation:
        """The one decode loop (requant.runtime.engine.generate) on this rank's reference engine;
        every rank gets the same Generation: the new ids per prompt and (keep_logits) the fp32
        logits [B, vocab] of each step."""
        tensors = self._tensors(prompts)
        with torch.no_grad():
            return generate(self.impl, tensors, max_new_tokens, eos_id, keep_logits, False, choose)
