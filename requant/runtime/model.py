"""The Qwen3 forward pass: batched prefill (`Model.logits`) and greedy decoding with a KV
cache (`Model.greedy`), on packed tokens with attention per sequence. The numerics and the
batch-invariance argument are in requant/runtime/__init__.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from requant import kernels
from requant.runtime.ops import apply_rope, attend_decode, attend_prompt, dense_rows, rms_norm, rope_tables
from requant.runtime.weights import (
    DENSE_LINEAR,
    REGIMES,
    Bf16Dir,
    arch_from_config,
    check_layout,
    load_bf16_dense,
    load_dense,
    load_linears,
)

REDUCTIONS = ("auto", "torch", "tree")
ENGINES = ("auto", "fast", "reference")


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class KVCache:
    """Keys and values of B sequences, per layer [B, KV, capacity, D] bf16, zero-filled (a
    position never written stays exactly 0: attend_decode relies on it), and each
    sequence's length (positions 0..length-1 hold its tokens)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, device):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.capacity = capacity
        self.lengths = [0] * batch  # on the host: no device sync to size a step


def decode_attention(cache: KVCache, arch, device) -> tuple[torch.Tensor, torch.Tensor, Callable]:
    """For one decode step of the reference engine's attention (one new token per row of
    `cache`, at position = its length): the RoPE tables and attend(i, q, k, v), which writes
    layer i's new keys and values into the cache and attends over each row's positions
    (attend_decode over a power-of-two span of the cache). Shared by requant.tp."""
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


@dataclass
class Generation:
    """What Model.generate returns: the new ids per prompt, and (keep_logits) the fp32
    logits [B, vocab] each new token was chosen from, one tensor per step."""

    ids: list[list[int]]
    step_logits: list[torch.Tensor] = field(default_factory=list)


class Model:
    """A Qwen3 on one device: dense bf16 tensors, one regime's quantized Linears (none for
    a bf16 model), a GEMM backend and an activation-quantization backend by name, and an
    engine: "reference" (this module's torch ops), "fast" (requant/runtime/fast.py: fused
    Triton kernels, CUDA graphs; its activation quantization is always its own Triton kernels,
    the same bits as every act backend) or "auto" (fast on CUDA when the model allows it)."""

    def __init__(
        self,
        config: dict,
        dense: dict[str, torch.Tensor],
        linears: dict[str, tuple[torch.Tensor, torch.Tensor]],
        *,
        backend: str = "reference-triton-order",
        act_backend: str = "reference",
        regime: str = "native",
        path: str | Path | None = None,
        tokenizer=None,
        reduction: str = "auto",
        engine: str = "auto",
    ):
        self.config = config
        self.arch = arch_from_config(config)
        self.dense = dense
        self.linears = linears
        if backend not in kernels.scaled_mm_backends():
            raise ValueError(f"unknown scaled_mm backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        self.backend = backend
        self.act_backend = act_backend
        self.regime = regime
        self.path = Path(path) if path is not None else None
        self.device = dense["model.embed_tokens.weight"].device
        self.reduction = reduction
        self.tree = reduction == "tree" or (reduction == "auto" and self.device.type != "cpu")
        self._tokenizer = tokenizer
        self._fp32: dict[str, torch.Tensor] = {}  # fp32 copies of dense Linear weights (shared by variants)
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.engine = engine
        self._fast = None  # FastWeights, built on first use (shared by with_backends copies)

    @property
    def fast(self) -> bool:
        """Whether this model runs the fast path (engine "fast", or "auto" on CUDA when it can)."""
        if self.engine == "reference":
            return False
        why = self.__dict__.get("_fast_why", False)
        if why is False:
            from requant.runtime.fast import fast_supported

            why = self._fast_why = fast_supported(self)
        if why is not None and self.engine == "fast":
            raise ValueError(f"the fast engine cannot run this model: {why}")
        return why is None and (self.engine == "fast" or self.device.type == "cuda")

    def _fastw(self):
        if self._fast is None:
            from requant.runtime.fast import FastWeights

            self._fast = FastWeights(self)
        return self._fast

    # -- properties ---------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 2048)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from requant.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.path, self.arch.vocab)
        return self._tokenizer

    def with_backends(
        self, backend: str | None = None, act_backend: str | None = None, engine: str | None = None
    ) -> "Model":
        """The same weights (shared, not copied) with other backends (or another engine)."""
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if self._fast is None and (engine or self.engine) != "reference" and self.fast:
            self._fastw()  # built once, before the copy, so that every variant shares it
        m = copy.copy(self)
        if engine is not None:
            m.engine = engine
        if backend is not None:
            if backend not in kernels.scaled_mm_backends():
                raise ValueError(
                    f"unknown scaled_mm backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}"
                )
            m.backend = backend
        if act_backend is not None:
            m.act_backend = act_backend
        return m

    def __repr__(self) -> str:
        a = self.arch
        return (
            f"Model({a.layers} layers, hidden {a.hidden}, vocab {a.vocab}, regime {self.regime}, "
            f"{len(self.linears)} quantized Linears, backend {self.backend}, act {self.act_backend}, {self.device})"
        )

    # -- building blocks ----------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.arch.eps, tree=self.tree)

    def _weight32(self, name: str) -> torch.Tensor:
        w = self._fp32.get(name)
        if w is None:
            w = self._fp32[name] = self.dense[name + ".weight"].to(torch.float32)
        return w

    def _linear(self, x: torch.Tensor, names: tuple[str, ...], capture) -> list[torch.Tensor]:
        """Linears that share one input; that input is quantized once (shared operands)."""
        quantized = [n for n in names if n in self.linears]
        if quantized:
            q, s = kernels.quantize_activations(x, backend=self.act_backend)
            if capture is not None:
                capture.record(tuple(quantized), q, s)
        outs = []
        for n in names:
            if n in self.linears:
                w, s_w = self.linears[n]
                outs.append(kernels.scaled_mm(q, w, s, s_w, backend=self.backend))
            else:
                outs.append(dense_rows(x, self._weight32(n)))
        return outs

    def _layer(self, i: int, x: torch.Tensor, cos, sin, attend, capture) -> torch.Tensor:
        """One decoder layer on packed tokens x [T, hidden]; attend(i, q, k, v) -> [T, H*D]."""
        sh, d = self.arch, self.dense
        p = f"model.layers.{i}."
        t = x.shape[0]
        h = self._norm(x, d[p + "input_layernorm.weight"])
        q, k, v = self._linear(h, (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"), capture)
        q = apply_rope(self._norm(q.view(t, sh.heads, sh.head_dim), d[p + "self_attn.q_norm.weight"]), cos, sin)
        k = apply_rope(self._norm(k.view(t, sh.kv_heads, sh.head_dim), d[p + "self_attn.k_norm.weight"]), cos, sin)
        attn = attend(i, q, k, v.view(t, sh.kv_heads, sh.head_dim))
        (o,) = self._linear(attn, (p + "self_attn.o_proj",), capture)
        x = x + o
        h = self._norm(x, d[p + "post_attention_layernorm.weight"])
        gate, up = self._linear(h, (p + "mlp.gate_proj", p + "mlp.up_proj"), capture)
        act = (torch.nn.functional.silu(gate.to(torch.float32)) * up.to(torch.float32)).to(torch.bfloat16)
        (down,) = self._linear(act, (p + "mlp.down_proj",), capture)
        return x + down

    def _head(self, x: torch.Tensor, capture) -> torch.Tensor:
        x = self._norm(x, self.dense["model.norm.weight"])
        (logits,) = self._linear(x, ("lm_head",), capture)
        return logits.to(torch.float32)

    # -- prefill and decode -------------------------------------------------------------
    def prefill(
        self, prompts: list[torch.Tensor], cache: KVCache | None = None, capture=None, last_only: bool = False
    ) -> torch.Tensor:
        """Packed prefill of 1-D id tensors. Returns fp32 logits [sum T, vocab] (last_only:
        [B, vocab], each prompt's last position). With a cache, each prompt's keys and
        values go to its row of the cache and its length is set."""
        if capture is None and self.fast:
            return self._fastw().prefill(self, prompts, cache=cache, last_only=last_only)
        sh = self.arch
        lens = [len(p) for p in prompts]
        bounds, s = [], 0
        for n in lens:
            bounds.append((s, s + n))
            s += n
        dev = self.device
        ids = torch.cat(prompts).to(dev)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        cos, sin = rope_tables(pos, sh.head_dim, sh.rope_theta)
        scale = sh.head_dim**-0.5

        def attend(i, q, k, v):
            if cache is not None:
                for j, (a, b) in enumerate(bounds):
                    cache.k[i][j, :, : b - a] = k[a:b].transpose(0, 1)
                    cache.v[i][j, :, : b - a] = v[a:b].transpose(0, 1)
            return torch.cat([attend_prompt(q[a:b], k[a:b], v[a:b], scale) for a, b in bounds])

        x = self.dense["model.embed_tokens.weight"][ids].to(torch.bfloat16)
        for i in range(sh.layers):
            x = self._layer(i, x, cos, sin, attend, capture)
        if cache is not None:
            cache.lengths = list(lens)
        if last_only:
            x = x[torch.tensor([b - 1 for _, b in bounds], device=dev)]
        return self._head(x, capture)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token per sequence of the cache (tokens [B] ids, at position = its
        length); appends to the cache and returns fp32 logits [B, vocab]."""
        if self.fast:
            return self._fastw().decode_step(self, tokens, cache)
        sh = self.arch
        dev = self.device
        cos, sin, attend = decode_attention(cache, sh, dev)
        x = self.dense["model.embed_tokens.weight"][tokens.to(dev)].to(torch.bfloat16)
        for i in range(sh.layers):
            x = self._layer(i, x, cos, sin, attend, None)
        cache.lengths = [n + 1 for n in cache.lengths]
        return self._head(x, None)

    # -- the API --------------------------------------------------------------------------
    def _as_tensors(self, prompts) -> list[torch.Tensor]:
        if isinstance(prompts, torch.Tensor) or not hasattr(prompts, "__len__") or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty list of token id lists")
        out = []
        vocab = self.arch.vocab
        for i, p in enumerate(prompts):
            t = (
                p.detach().to("cpu", torch.long).reshape(-1)
                if isinstance(p, torch.Tensor)
                else torch.tensor(list(p), dtype=torch.long)
            )
            if t.numel() == 0:
                raise ValueError(f"prompt {i} is empty")
            if int(t.min()) < 0 or int(t.max()) >= vocab:
                raise ValueError(f"prompt {i} has a token id outside 0..{vocab - 1}")
            if t.numel() > self.max_length:
                raise ValueError(f"prompt {i} has {t.numel()} tokens, more than max_length {self.max_length}")
            out.append(t)
        return out

    def logits(self, prompts, capture=None) -> list[torch.Tensor]:
        """fp32 logits [T_i, vocab] per prompt (each attended on its own), on the model's device.
        capture: an object with record(names, q, s), called once per quantized input."""
        tensors = self._as_tensors(prompts)
        with torch.no_grad():
            flat = self.prefill(tensors, capture=capture)
        return list(torch.split(flat, [len(t) for t in tensors]))

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        sh = self.arch
        return KVCache(sh.layers, batch, sh.kv_heads, capacity, sh.head_dim, self.device)

    def extend(self, chunks, cache: KVCache) -> torch.Tensor:
        """Fast engine only: append chunk j (token ids) to row j of the cache, after its cached
        positions (chunked prefill after a cached prefix); fp32 logits [sum of chunk lengths,
        vocab] of every chunk token, in order. The logits are the same bits as prefilling the
        whole sequence (see requant/runtime/fast.py)."""
        if not self.fast:
            raise ValueError("extend needs the fast engine")
        with torch.no_grad():
            return self._fastw().extend(self, [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in chunks], cache)

    def generate(
        self, prompts, max_new_tokens: int = 64, eos_id=None, keep_logits: bool = False, graphs: bool = True
    ) -> Generation:
        """Greedy decoding with a KV cache (see greedy); keep_logits also returns each step's
        logits. graphs: on the fast engine on CUDA, replay decode steps from CUDA graphs
        (False: the same kernels launched eagerly; the same bits)."""
        tensors = self._as_tensors(prompts)
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        longest = max(len(t) for t in tensors) + max_new_tokens
        if longest > self.max_length:
            raise ValueError(f"prompt + new tokens = {longest} positions, more than max_length {self.max_length}")
        eos = (
            set()
            if eos_id is None
            else {int(e) for e in (eos_id if isinstance(eos_id, (list, tuple, set, frozenset)) else [eos_id])}
        )
        gen = Generation([[] for _ in tensors])
        if max_new_tokens == 0:
            return gen
        if self.fast:
            with torch.no_grad():
                return self._fastw().generate(self, tensors, max_new_tokens, eos, keep_logits, graphs)
        cache = self.new_cache(len(tensors), pow2_at_least(longest))
        done = [False] * len(tensors)
        with torch.no_grad():
            logits = self.prefill(tensors, cache=cache, last_only=True)
            for step in range(max_new_tokens):
                nxt = torch.argmax(logits, dim=-1)  # ties: the first (lowest) id, on CPU and CUDA
                if keep_logits:
                    gen.step_logits.append(logits)
                for j, tok in enumerate(nxt.tolist()):
                    if not done[j]:
                        gen.ids[j].append(tok)
                        done[j] = tok in eos
                if all(done) or step == max_new_tokens - 1:
                    break
                # finished sequences keep a row (their tokens are dropped): rows never interact
                logits = self.decode_step(nxt, cache)
        return gen

    def greedy(self, prompts, max_new_tokens: int = 64, eos_id=None) -> list[list[int]]:
        """Greedy decoding with a KV cache, batched; returns only the new ids per prompt. A
        sequence stops after emitting eos_id (an id or a collection of ids; included) or
        after max_new_tokens. Ties in the argmax go to the lowest id."""
        return self.generate(prompts, max_new_tokens, eos_id).ids


def load_model(
    src,
    regime: str = "native",
    backend: str = "reference-triton-order",
    act_backend: str = "reference",
    device="cpu",
    *,
    revision: str | None = None,
    share: Model | None = None,
    reduction: str = "auto",
    engine: str = "auto",
) -> Model:
    """A Model from a W8A8 checkpoint (directory, Hub id or requant.checkpoint.Checkpoint)
    in one regime, or from a plain bf16 Qwen3 directory (no quantization_config: every
    Linear dense, regime "bf16"). share: a Model of the same checkpoint whose dense tensors
    (embeddings, norms, dense lm_head and its fp32 copy) this one reuses instead of reading
    them again (e.g. pow2 next to native). reduction: the RMSNorm reduction, "auto" (tree
    sums on CUDA, torch's reduction on the CPU), "torch" or "tree" (see the package docstring).
    engine: "auto" (the fast path on CUDA for a W8A8 checkpoint, else the reference path),
    "fast" or "reference" (see requant/runtime/fast.py)."""
    if backend not in kernels.scaled_mm_backends():
        raise ValueError(f"unknown scaled_mm backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}")
    dev = torch.device(device)
    if backend == "cutlass" and dev.type != "cuda":
        raise ValueError("the cutlass backend needs a CUDA device")
    ckpt = src if hasattr(src, "quantized_linears") else None
    if ckpt is None:
        p = Path(src)
        cfg_path = p / "config.json"
        if p.is_dir() and cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text())
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{cfg_path}: not valid JSON: {exc}") from None
            if isinstance(cfg, dict) and cfg.get("quantization_config") is None:
                if regime not in ("native", DENSE_LINEAR, "bf16"):
                    raise ValueError(
                        f"{cfg_path}: a bf16 checkpoint (no quantization_config) has no scales for regime {regime!r}"
                    )
                bdir = Bf16Dir(p, cfg)
                dense = share.dense if share is not None else load_bf16_dense(bdir, dev)
                m = Model(
                    cfg,
                    dense,
                    {},
                    backend=backend,
                    act_backend=act_backend,
                    regime="bf16",
                    path=p,
                    reduction=reduction,
                    engine=engine,
                )
                if share is not None:
                    m._fp32 = share._fp32
                return m
        from requant.checkpoint import open_checkpoint

        ckpt = open_checkpoint(src, revision=revision)
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; known: {', '.join(REGIMES)}")
    check_layout(ckpt)
    dense = share.dense if share is not None else load_dense(ckpt, dev)
    m = Model(
        ckpt.config,
        dense,
        load_linears(ckpt, regime, dev),
        backend=backend,
        act_backend=act_backend,
        regime=regime,
        path=getattr(ckpt, "path", None),
        reduction=reduction,
        engine=engine,
    )
    if share is not None:
        m._fp32 = share._fp32
        m._tokenizer = share._tokenizer
    return m
