"""Seeded sampling that cannot depend on the batch, the engine or the machine.

    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=7)   # greedy: temperature 0
    out = generate(model, [ids, ...], [params, ...], max_new_tokens=32)       # per request
    out[0].ids, out[0].steps[0].logits_sha256, out[0].steps[0].logprob        # a hex float
    model.generate(prompts, choose=chooser(resolved_params, prompt_lengths))   # the raw hook

THE RANDOM NUMBER of request r at absolute position t (prompt length + step) is
U = the first 16 bytes, big-endian, of SHA-256(b"requant-sample-v1" | seed as 8 bytes LE |
len(key) as 8 bytes LE | key (UTF-8) | t as 8 bytes LE): an integer in [0, 2**128), keyed by
the request alone, never a stream shared by the batch. key: the request's own name (default: the
sha256 hex of its prompt ids as little-endian int64).

The definition, and what holds: docs/runtime.md#the-sampler-in-its-fixed-order.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field, replace
from fractions import Fraction

import torch

from requant.kernels.math64 import exp64, log64
from requant.runtime._sampling_core import SUM_FLOOR, WEIGHT_BITS, WEIGHT_FLOOR, uniform_int
from requant.runtime.sampling_batch import choose_batch

__all__ = [
    "METHOD",
    "MAX_TOP_K",
    "SamplingParams",
    "Step",
    "Sampled",
    "Chooser",
    "chooser",
    "generate",
    "resolve",
    "prompt_key",
    "uniform_int",
    "exp64",
    "log64",
    "choose_row",
    "row_logprob",
    "logits_sha256",
]

METHOD = "requant-inverse-cdf-v1"
# top_k past the vocabulary keeps every token, as 0 does; a value past any vocabulary (token ids
# are below 2**31, requant.runtime.generation.MAX_ID) is refused rather than carried into a
# record. The model's own vocabulary is checked once it is known (generate, replay).
MAX_TOP_K = 2**31 - 1


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling: temperature 0 is greedy; top_k 0 and top_p 1.0 keep every
    token; seed in [0, 2**64); key names the request (None: its prompt digest, see resolve)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    key: str | None = None

    def check(self, where: str = "sampling", labels: dict | None = None) -> "SamplingParams":
        """self, or ValueError naming `where` and the field (labels: {field: what to call it},
        e.g. {"top_p": "--top-p"} on the command line; where "" then leaves only that name)."""
        t, p, k = self.temperature, self.top_p, self.top_k
        name = {f: f for f in ("temperature", "top_k", "top_p", "seed", "key")} | (labels or {})
        at = f"{where}: " if where else ""
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"{at}{name['temperature']} must be a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_K:
            raise ValueError(
                f"{at}{name['top_k']} must be an integer from 0 (every token) to the vocabulary's size, got {str(k)[:40]}"
            )
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise ValueError(f"{at}{name['top_p']} must be in (0, 1], got {p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise ValueError(f"{at}{name['seed']} must be an integer in [0, 2**64), got {str(self.seed)[:40]}")
        if self.key is not None and not isinstance(self.key, str):
            raise ValueError(f"{at}{name['key']} must be a string, got {self.key!r}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return {
            "temperature": float(self.temperature),
            "top_k": self.top_k,
            "top_p": float(self.top_p),
            "seed": self.seed,
            "method": "greedy" if self.greedy else METHOD,
        }


def prompt_key(ids) -> str:
    """The default request key: sha256 hex of the prompt ids as little-endian int64."""
    ids = [int(i) for i in ids]
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()


def resolve(params: SamplingParams, prompt_ids) -> SamplingParams:
    """params checked, with its key filled in (the prompt's digest) when it has none."""
    params.check()
    return params if params.key is not None else replace(params, key=prompt_key(prompt_ids))


def _weights(x: torch.Tensor) -> torch.Tensor:
    """floor(exp64(x) * 2**40) as int64 (the scaling is exact; the cast floors, x >= 0)."""
    w = torch.zeros(x.shape, dtype=torch.int64)
    sel = torch.nonzero(x >= WEIGHT_FLOOR)[:, 0]
    w[sel] = (exp64(x[sel]) * float(2**WEIGHT_BITS)).to(torch.int64)
    return w


def row_logprob(row: torch.Tensor, token: int) -> float:
    """The float64 log-softmax of `token` in the fp32 row (temperature 1), as documented above."""
    r64 = row.to(torch.float64)
    x = r64 - r64.max()
    e = exp64(x[x >= SUM_FLOOR]) * float(2**WEIGHT_BITS)
    hi = e.to(torch.int64)
    lo = ((e - hi.to(torch.float64)) * float(2**WEIGHT_BITS)).to(torch.int64)  # both steps exact
    z = (int(hi.sum()) << WEIGHT_BITS) + int(lo.sum())
    return float(x[token]) - log64(z / 2 ** (2 * WEIGHT_BITS))  # int / int: rounded once


def choose_row(row: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The token id chosen from one fp32 CPU logits row (see the module docstring)."""
    top = row.max()
    if params.greedy:
        return int(torch.nonzero(row == top)[0, 0])
    r64 = row.to(torch.float64)
    w = _weights((r64 - float(top)) / float(params.temperature))
    live = torch.nonzero(w > 0)[:, 0]  # zero-weight tokens change no sum and are never drawn
    vals = row[live]
    order = live[torch.sort(vals, descending=True, stable=True).indices]  # ties: ids ascending (live is sorted)
    if params.top_k > 0:
        order = order[: params.top_k]
    cum = torch.cumsum(w[order], 0)  # integer: exact in any order of evaluation
    if params.top_p < 1:
        p = Fraction(params.top_p)
        need = -((-p.numerator * int(cum[-1])) // p.denominator)  # ceil(top_p * W), exactly
        n = int(torch.searchsorted(cum, torch.tensor([need], dtype=torch.int64))[0]) + 1
        cum = cum[:n]
    r = (uniform_int(params.seed, params.key, position) * int(cum[-1])) >> 128
    return int(order[int(torch.searchsorted(cum, torch.tensor([r], dtype=torch.int64), right=True)[0])])


def logits_sha256(row: torch.Tensor) -> str:
    """sha256 hex of the row's fp32 bytes, little-endian."""
    return hashlib.sha256(row.contiguous().numpy().astype("<f4", copy=False).tobytes()).hexdigest()


@dataclass
class Step:
    """One generated token: its absolute position, id, logits digest and logprob (float.hex;
    both None when the chooser did not record them)."""

    position: int
    token: int
    logits_sha256: str | None
    logprob: str | None


@dataclass
class Sampled:
    """One request's generation: its params (key filled in), new ids and one Step per id."""

    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)


class Chooser:
    """The `choose` hook of Model.generate for a batch of requests: per step, one batched
    computation on the logits' device (requant.runtime.sampling_batch.choose_batch: the bits of
    choose_row, row_logprob and logits_sha256, row by row), each row by its own params at its
    own position; every row's Step is recorded (Model.generate drops those after a row's eos).
    record=False: Steps carry no logits digest and no logprob (None), which is cheaper."""

    def __init__(self, requests, prompt_lengths, on_token=None, record: bool = True):
        self.requests = [p.check(f"request {j}") for j, p in enumerate(requests)]
        for j, p in enumerate(self.requests):
            if p.key is None:
                raise ValueError(f"request {j}: no key (requant.runtime.sampling.resolve fills in the prompt's digest)")
        self.lengths = [int(n) for n in prompt_lengths]
        if len(self.lengths) != len(self.requests):
            raise ValueError(f"{len(self.requests)} requests but {len(self.lengths)} prompt lengths")
        self.steps: list[list[Step]] = [[] for _ in self.requests]
        self.on_token = on_token
        self.record = record
        self._host = None  # the pinned host copy of a CUDA step's logits (digests), reused

    def _host_buffer(self, logits: torch.Tensor):
        if logits.device.type != "cuda":
            return None
        if self._host is None or self._host.shape != logits.shape:
            self._host = torch.empty(logits.shape, dtype=torch.float32, pin_memory=True)
        return self._host

    def __call__(self, step: int, logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or logits.shape[0] != len(self.requests):
            raise ValueError(f"logits of shape {list(logits.shape)} for {len(self.requests)} requests")
        positions = [n + step for n in self.lengths]
        fresh = [len(s) == step for s in self.steps]  # once per step (a caller retrying a step keeps the first)
        record = self.record and any(fresh)
        host = self._host_buffer(logits) if record else None
        tokens, ids, logprobs, digests = choose_batch(logits, self.requests, positions, record, host=host)
        for j, tok in enumerate(ids):
            if fresh[j]:
                sha, lp = (digests[j], logprobs[j]) if record else (None, None)
                self.steps[j].append(Step(positions[j], tok, sha, lp))
                if self.on_token is not None:
                    self.on_token(j, step, tok)
        return tokens


def chooser(requests, prompt_lengths, on_token=None, record: bool = True) -> Chooser:
    """The choose callback for Model.generate: requests are SamplingParams with keys (resolve),
    prompt_lengths the prompts' lengths (a step's absolute position is length + step).
    on_token(row, step, token): called as each row's token is chosen (streaming).
    record=False: no logits digests or logprobs in the Steps."""
    return Chooser(requests, prompt_lengths, on_token, record)


def generate(
    model,
    prompts,
    params,
    max_new_tokens: int = 64,
    eos_id=None,
    graphs: bool = True,
    on_token=None,
    record: bool = True,
) -> list[Sampled]:
    """Batch generation with per-request sampling: prompts are token id lists, params one
    SamplingParams for all or one per prompt. Returns one Sampled per prompt (record=False:
    its Steps hold no logits digest or logprob, None)."""
    prompts = [[int(i) for i in p] for p in prompts]
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    reqs = [resolve(p, ids) for p, ids in zip(params, prompts)]
    ch = chooser(reqs, [len(p) for p in prompts], on_token, record)
    gen = model.generate(prompts, max_new_tokens=max_new_tokens, eos_id=eos_id, graphs=graphs, choose=ch)
    out = []
    for j, ids in enumerate(gen.ids):
        steps = ch.steps[j][: len(ids)]
        if [s.token for s in steps] != list(ids):
            raise RuntimeError(f"request {j}: the engine's tokens are not the chooser's")
        out.append(Sampled(reqs[j], list(ids), steps))
    return out
