"""The engine protocol, and the one decode loop every engine runs (prefill, choose, step).

An engine (reference.py, fast.py, portable.py; tensor parallelism runs the reference one on each
rank) is an `Engine`; `generate(engine, prompts, ...)` is the only generation loop. The engine
supplies a `Decoder`: a KV cache plus `step(tokens) -> logits`; the fast engine's step replays
its CUDA graph. The contract of each method: docs/runtime.md ("The engine interface").
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from requant.runtime.cache import Generation, KVCache, argmax_choose, generation_capacity, stop_ids

__all__ = ["Decoder", "Engine", "EagerDecoder", "generate"]


@runtime_checkable
class Decoder(Protocol):
    """One generation's decode state: `cache` (prefilled by the loop), `start(lengths)` after the
    prefill, `step(tokens [B]) -> fp32 logits [B, vocab]`. `static_logits`: step returns a view of
    a buffer the next step overwrites. `sync_every`: the loop reads the chosen ids on the host
    (to stop when every row has emitted an eos) every this many steps."""

    cache: KVCache
    static_logits: bool
    sync_every: int

    def start(self, lengths: list[int]) -> None: ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Engine(Protocol):
    """A Qwen3 forward over one model's weights (docs/runtime.md, "The engine interface")."""

    name: str

    def new_cache(self, batch: int, capacity: int) -> KVCache: ...

    def prefill(self, prompts, cache=None, capture=None, last_only: bool = False) -> torch.Tensor: ...

    def extend(self, chunks, cache: KVCache) -> torch.Tensor: ...

    def decode_step(self, tokens: torch.Tensor, cache: KVCache, capture=None) -> torch.Tensor: ...

    def decoder(self, batch: int, capacity: int, graphs: bool) -> Decoder: ...


class EagerDecoder:
    """The decoder of an engine without graphs: decode_step on a cache of exactly `batch` rows."""

    static_logits = False
    sync_every = 1  # the host reads each step's ids anyway: stop as soon as every row is done

    def __init__(self, engine: Engine, batch: int, capacity: int):
        self.engine = engine
        self.cache = engine.new_cache(batch, capacity)

    def start(self, lengths: list[int]) -> None:
        pass  # prefill set the lengths

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.engine.decode_step(tokens, self.cache)


def _first_eos(row: list[int], eos: frozenset[int]) -> int:
    """How many of row's ids the sequence keeps: up to and including its first eos."""
    for i, tok in enumerate(row):
        if tok in eos:
            return i + 1
    return len(row)


def generate(
    engine: Engine,
    prompts: list[torch.Tensor],
    max_new_tokens: int = 64,
    eos_id=None,
    keep_logits: bool = False,
    graphs: bool = True,
    choose=None,
) -> Generation:
    """Prefill, then choose and step until max_new_tokens or every row's eos. choose(step, logits
    fp32 [B, vocab]) -> ids [B] (None: the argmax, ties to the lowest id) is called once per step
    on every row; a row keeps its ids up to its first eos (included), and the Generation holds the
    logits of as many steps as its longest row (keep_logits). Rows never interact, so the steps a
    decoder runs past the last eos (up to sync_every - 1) change no kept bit."""
    choose = argmax_choose if choose is None else choose
    eos = stop_ids(eos_id)
    b = len(prompts)
    gen = Generation([[] for _ in prompts])
    if max_new_tokens <= 0:
        return gen
    dec = engine.decoder(b, generation_capacity(max(len(t) for t in prompts) + max_new_tokens), graphs)
    logits = engine.prefill(prompts, cache=dec.cache, last_only=True)
    dec.start([len(t) for t in prompts])
    rows: list[list[int]] = [[] for _ in prompts]
    pending: list[torch.Tensor] = []  # chosen ids [b] not yet read on the host
    kept: list[torch.Tensor] = []
    done = [False] * b

    def settle() -> bool:  # read the pending ids; True when every row has emitted an eos
        if pending:
            for j, new in enumerate(torch.stack(pending, 1).tolist()):
                rows[j] += new
                done[j] = done[j] or any(t in eos for t in new)
            pending.clear()
        return all(done)

    nxt = None
    for step in range(max_new_tokens):
        if step:
            if eos and step % dec.sync_every == 0 and settle():
                break
            logits = dec.step(nxt)
            if keep_logits and dec.static_logits:
                logits = logits.clone()
        nxt = choose(step, logits).reshape(-1).to(torch.long)
        pending.append(nxt)
        if keep_logits:
            kept.append(logits)
    settle()
    for j, row in enumerate(rows):
        gen.ids[j] = row[: _first_eos(row, eos)]
    if keep_logits:
        gen.step_logits = kept[: max(len(r) for r in gen.ids)]
    return gen
