"""The runtime's front: `Model`, a Qwen3 on one device (its weights, backends and regime)
over one engine chosen once, and `load_model`. The engines (reference.py, fast.py, portable.py)
are `Engine`s (engine.py); the front validates the prompts and delegates, and `generate` is the
one decode loop, engine.generate. The contract: requant/runtime/__init__.py; the numerics:
docs/runtime.md.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from requant import kernels
from requant.checkpoint import open_checkpoint
from requant.models.qwen3_moe import Qwen3MoeArch
from requant.models.tokenizer import load_tokenizer
from requant.regime import NATIVE, check_regime
from requant.runtime.cache import Generation, KVCache
from requant.runtime.engine import generate as run_generation
from requant.runtime.fast import FastEngine, FastLayout, fast_supported
from requant.runtime.portable import PortableEngine, PortableLayout, portable_supported
from requant.runtime.reference import ReferenceEngine
from requant.runtime.weights import (
    BF16,
    Bf16Dir,
    arch_from_config,
    check_layout,
    load_bf16_dense,
    load_dense,
    load_linears,
)

__all__ = ["ENGINES", "REDUCTIONS", "Model", "load_model"]

REDUCTIONS = ("auto", "torch", "tree")
ENGINES = ("auto", "fast", "reference", "portable")


def _check_backend(backend: str) -> None:
    if not kernels.is_scaled_mm(backend):
        raise ValueError(f"unknown scaled_mm backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}")


class Model:
    """A Qwen3 on one device: dense bf16 tensors, one regime's quantized Linears (none for
    a bf16 model), a GEMM backend and an activation-quantization backend by name, and an
    engine: "reference" (torch ops), "fast" (fused Triton kernels, CUDA graphs; its
    activation quantization is always its own Triton kernels, the same bits as every act
    backend), "portable" (runtime/portable.py; only on request) or "auto" (fast on CUDA when
    the model allows it), resolved once: `engine` is then the engine's name, and `impl` the
    engine object."""

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
        _check_backend(backend)
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
        self._layouts: dict = {}  # the fast engine's weight layout, once built (shared by variants)
        self._choose_engine(engine)

    def _choose_engine(self, engine: str) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine == "portable":  # the one arithmetic every machine computes (runtime/portable.py)
            why = portable_supported(self)
            if why is not None:
                raise ValueError(f"the portable engine cannot run this model: {why}")
            if "portable" not in self._layouts:
                self._layouts["portable"] = PortableLayout(self)
            self.impl = PortableEngine(self, self._layouts["portable"])
            self.engine = self.impl.name
            return
        # Qwen3-MoE runs the fast engine when asked by name; "auto" keeps the reference engine for it
        # until its GPU run (benchmarks/gpu_moe.sh) is measured (docs/moe.md)
        auto_fast = self.device.type == "cuda" and not isinstance(self.arch, Qwen3MoeArch)
        want_fast = engine == "fast" or (engine == "auto" and auto_fast)
        why = fast_supported(self) if want_fast else "not asked for"
        if engine == "fast" and why is not None:
            raise ValueError(f"the fast engine cannot run this model: {why}")
        if why is None:
            if "fast" not in self._layouts:
                self._layouts["fast"] = FastLayout(self)
            self.impl = FastEngine(self, self._layouts["fast"])
        else:
            self.impl = ReferenceEngine(self)
        self.engine = self.impl.name

    # -- properties ---------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 2048)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path, self.arch.vocab)
        return self._tokenizer

    def with_backends(
        self, backend: str | None = None, act_backend: str | None = None, engine: str | None = None
    ) -> Model:
        """The same weights (shared, not copied) with other backends (or another engine)."""
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if backend is not None:
            _check_backend(backend)
        m = copy.copy(self)
        if backend is not None:
            m.backend = backend
        if act_backend is not None:
            m.act_backend = act_backend
        m._choose_engine(self.engine if engine is None else engine)  # an engine bound to the copy
        return m

    def __repr__(self) -> str:
        a = self.arch
        return (
            f"Model({a.layers} layers, hidden {a.hidden}, vocab {a.vocab}, regime {self.regime}, "
            f"{len(self.linears)} quantized Linears, backend {self.backend}, act {self.act_backend}, "
            f"engine {self.engine}, {self.device})"
        )

    # -- the engine's methods -------------------------------------------------------------
    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache of `batch` rows holding exactly `capacity` positions."""
        return self.impl.new_cache(batch, capacity)

    def prefill(
        self, prompts: list[torch.Tensor], cache: KVCache | None = None, capture=None, last_only: bool = False
    ) -> torch.Tensor:
        """Packed prefill of 1-D id tensors: fp32 logits [sum T, vocab] (last_only: [B, vocab],
        each prompt's last position). With a cache, each prompt's keys and values go to its
        row and its length is set. capture: record(names, q, s) per quantized input."""
        return self.impl.prefill(prompts, cache=cache, capture=capture, last_only=last_only)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache, capture=None) -> torch.Tensor:
        """One new token per sequence of the cache (tokens [B] ids, at position = its
        length); appends to the cache and returns fp32 logits [B, vocab]."""
        return self.impl.decode_step(tokens, cache, capture=capture)

    def extend(self, chunks, cache: KVCache) -> torch.Tensor:
        """Fast engine only: append chunk j (token ids) to row j of the cache, after its cached
        positions; fp32 logits [sum of chunk lengths, vocab] of every chunk token, in order,
        the same bits as prefilling the whole sequence."""
        with torch.no_grad():
            return self.impl.extend([torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in chunks], cache)

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

    def generate(
        self,
        prompts,
        max_new_tokens: int = 64,
        eos_id=None,
        keep_logits: bool = False,
        graphs: bool = True,
        choose=None,
    ) -> Generation:
        """Decoding with a KV cache, batched. A sequence stops after emitting eos_id (an id or a
        collection of ids; included) or after max_new_tokens. choose(step, logits fp32 [B,
        vocab] on the device) -> ids [B] picks each step's tokens, called once per step on
        every row (None: the argmax, ties to the lowest id). keep_logits: each step's logits
        too. graphs: on the fast engine on CUDA, replay decode steps from CUDA graphs (False:
        the same kernels launched eagerly; the same bits)."""
        tensors = self._as_tensors(prompts)
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        longest = max(len(t) for t in tensors) + max_new_tokens
        if longest > self.max_length:
            raise ValueError(f"prompt + new tokens = {longest} positions, more than max_length {self.max_length}")
        with torch.no_grad():
            return run_generation(self.impl, tensors, max_new_tokens, eos_id, keep_logits, graphs, choose)

    def greedy(self, prompts, max_new_tokens: int = 64, eos_id=None) -> list[list[int]]:
        """generate's new ids per prompt (the argmax at every step)."""
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
    sums on CUDA, torch's reduction on the CPU), "torch" or "tree" (docs/runtime.md).
    engine: "auto" (the fast engine on CUDA for a W8A8 checkpoint, else the reference one),
    "fast" or "reference", resolved once (Model.engine)."""
    _check_backend(backend)
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
                if regime not in (NATIVE, BF16):
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
                    regime=BF16,
                    path=p,
                    reduction=reduction,
                    engine=engine,
                )
                if share is not None:
                    m._fp32 = share._fp32
                return m

        ckpt = open_checkpoint(src, revision=revision)
    check_regime(regime)  # the one check below the command line (requant.regime)
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
