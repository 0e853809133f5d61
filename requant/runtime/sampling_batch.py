"""The chooser's batched form: one [B, vocab] computation a step, on the logits' device, giving
the bits of requant.runtime.sampling's per-row definition (choose_row, row_logprob, logits_sha256 are
the reference; tests/requant/runtime/test_sampling_batch.py compares them bit for bit).

    tokens, ids, logprobs, digests = choose_batch(logits, requests, positions, record=True)

Why the bits cannot move with the device: docs/runtime.md#the-sampler-in-its-fixed-order.
"""

from __future__ import annotations

import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import torch

from requant.kernels.math64 import exp64, log64
from requant.runtime._sampling_core import SUM_FLOOR, WEIGHT_BITS, WEIGHT_FLOOR, uniform_int

__all__ = ["choose_batch", "check_rows", "digests"]

_ID_BITS = 23  # ids < 2**23: the vocabulary limit of check_rows (2**(63 - WEIGHT_BITS))
_DEAD = 2**62  # the key of a zero-weight token, above every live one (< 2**55)
_PREFIX = 1024  # keys taken first; a kept set of real logits rarely reaches past them
_CPU_BLOCK = 2**17  # float64 entries per CPU block of rows (1 MiB a temporary)
_SCALE = float(2**WEIGHT_BITS)
_pool: ThreadPoolExecutor | None = None


def check_rows(rows: torch.Tensor, where) -> None:
    """ValueError naming the first bad row: where(j) says which request and position it is."""
    if rows.dim() != 2 or rows.dtype != torch.float32:
        raise ValueError(f"{where(0)}: logits must be fp32 [batch, vocab], got {rows.dtype} {list(rows.shape)}")
    if rows.shape[1] >= 2 ** (63 - WEIGHT_BITS):
        raise ValueError(f"{where(0)}: a vocabulary of {rows.shape[1]} ids is too large for int64 weights")
    bad = ~torch.isfinite(rows).all(1)
    if bool(bad.any()):
        raise ValueError(f"{where(int(bad.nonzero()[0, 0]))}: the logits row is not finite")


def _masked_exp(x: torch.Tensor, floor: float) -> torch.Tensor:
    """exp64(x) where x >= floor, 0 elsewhere (computed on every entry: dense elementwise
    calls cost less than gathering the entries, on the CPU too)."""
    return exp64(x).masked_fill_(x < floor, 0.0)


def _greedy(rows: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """The lowest id among each row's maxima."""
    ids = torch.arange(rows.shape[1], device=rows.device)
    return torch.where(rows == top[:, None], ids, rows.shape[1]).amin(1)


def _descending_keys(vals: torch.Tensor) -> torch.Tensor:
    """fp32 values -> int64 in [0, 2**32), ascending as the values descend (-0 and +0 equal)."""
    b = (vals + 0.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # x + 0.0: -0 becomes +0
    up = torch.where(b >= 2**31, 0xFFFFFFFF - b, b + 2**31)  # ascending with the value
    return 0xFFFFFFFF - up


def _ceil_share(top_p: float, total: int) -> int:
    q = Fraction(top_p)
    return -((-q.numerator * total) // q.denominator)  # ceil(top_p * W), exactly


def _sample(rows: torch.Tensor, top: torch.Tensor, reqs, positions) -> torch.Tensor:
    """The ids that choose_row chooses from sampled rows. The order is taken by prefixes: the
    first _PREFIX keys of each row (torch.topk of unique keys: one exact answer), and the whole
    row only for the rows whose kept set or draw reaches past that prefix."""
    n_rows, vocab = rows.shape
    dev = rows.device
    temp = torch.tensor([float(p.temperature) for p in reqs], dtype=torch.float64, device=dev)[:, None]
    x = (rows.to(torch.float64) - top.to(torch.float64)[:, None]) / temp
    w = _masked_exp(x, WEIGHT_FLOOR).mul_(_SCALE).to(torch.int64)
    live = w > 0  # zero-weight tokens change no sum and are never drawn: they sort last
    ids = torch.arange(vocab, device=dev)
    keys = torch.where(live, _descending_keys(rows) << _ID_BITS, _DEAD) | ids
    facts = torch.stack([w.sum(1), live.sum(1)], 1).tolist()  # W over the row, live tokens
    k_all = [min(p.top_k, vocab) if p.top_k else vocab for p in reqs]  # a k past the vocabulary keeps all
    tokens = torch.empty(n_rows, dtype=torch.int64, device=dev)
    todo, m = list(range(n_rows)), min(_PREFIX, vocab)
    while todo:
        sel = torch.tensor(todo, device=dev)
        part = keys.index_select(0, sel)
        if m < vocab:
            order = torch.topk(part, m, dim=1, largest=False, sorted=True).indices
        else:
            order = torch.sort(part, dim=1).indices
        k = torch.tensor([k_all[i] for i in todo], dtype=torch.int64, device=dev)[:, None]
        cum = torch.cumsum(w.index_select(0, sel).gather(1, order) * (ids[:m] < k), 1)  # top_k; exact
        last = cum[:, -1].tolist()
        total, need = [], []  # W of the kept set (None: not known from this prefix), ceil(top_p * W)
        for i, c in zip(todo, last):
            t, n_live = facts[i]
            t = c if k_all[i] <= m or n_live <= m else (t if k_all[i] >= n_live else None)
            total.append(t)
            need.append(0 if t is None or reqs[i].top_p >= 1 else _ceil_share(reqs[i].top_p, t))
        kept = list(total)  # W': top_p 1 keeps W
        if any(reqs[i].top_p < 1 for i in todo):
            at = torch.searchsorted(cum, torch.tensor(need, dtype=torch.int64, device=dev)[:, None])
            cut = cum.gather(1, at.clamp_(max=m - 1))[:, 0].tolist()
            kept = [x if reqs[i].top_p < 1 else t for i, x, t in zip(todo, cut, kept)]
        draw, left, done = [], [], []  # done: (index in todo, row)
        for j, (i, c) in enumerate(zip(todo, last)):
            r = None
            if total[j] is not None and c >= need[j]:
                r = (uniform_int(reqs[i].seed, reqs[i].key, positions[i]) * kept[j]) >> 128
            if r is None or c <= r:  # the kept set or the draw reaches past this prefix
                left.append(i)
                draw.append(0)
            else:
                done.append((j, i))
                draw.append(r)
        if done:
            at = torch.searchsorted(cum, torch.tensor(draw, dtype=torch.int64, device=dev)[:, None], right=True)
            picked = torch.tensor([j for j, _ in done], device=dev)
            chosen = order.index_select(0, picked).gather(1, at.index_select(0, picked))[:, 0]
            tokens[torch.tensor([i for _, i in done], device=dev)] = chosen
        todo, m = left, vocab
    return tokens


def _logprobs(rows: torch.Tensor, top: torch.Tensor, tokens: torch.Tensor) -> list[str]:
    """row_logprob of each row's token (float.hex), the sum's parts as int64 row sums."""
    x = rows.to(torch.float64) - top.to(torch.float64)[:, None]
    e = _masked_exp(x, SUM_FLOOR).mul_(_SCALE)
    hi = e.to(torch.int64)
    lo = e.sub_(hi.to(torch.float64)).mul_(_SCALE).to(torch.int64)  # both steps exact
    parts = torch.stack([hi.sum(1), lo.sum(1)], 1).tolist()
    xt = x.gather(1, tokens[:, None])[:, 0].tolist()
    return [(v - log64(((h << WEIGHT_BITS) + lo_) / 2 ** (2 * WEIGHT_BITS))).hex() for v, (h, lo_) in zip(xt, parts)]


def _hash(row) -> str:
    return hashlib.sha256(row).hexdigest()


def _start_digests(host_rows: torch.Tensor):
    """Start hashing the rows of a CPU fp32 block; returns a function giving the hex digests."""
    global _pool
    block = host_rows.contiguous().numpy()
    if sys.byteorder != "little":
        block = block.astype("<f4")
    if len(block) < 4:
        done = [_hash(r) for r in block]
        return lambda: done
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="requant-sha256")
    futures = [_pool.submit(_hash, r) for r in block]
    return lambda: [f.result() for f in futures]


def digests(host_rows: torch.Tensor) -> list[str]:
    """logits_sha256 of each row of a CPU fp32 [B, vocab] block."""
    return _start_digests(host_rows)()


def choose_batch(logits: torch.Tensor, requests, positions, record: bool = True, where=None, host=None):
    """One step for a batch: requests are checked SamplingParams with keys, positions the rows'
    absolute positions. Returns (ids [B] long on the logits' device, ids as a list, logprobs
    (float.hex) or None, logits digests or None); record=False skips the last two. host: a CPU
    fp32 tensor of the logits' shape to copy into (pinned: faster), else one is made."""
    rows = logits.detach().to(torch.float32)
    if where is None:

        def where(j):
            return f"request {j} ({requests[j].key}), position {positions[j]}"

    check_rows(rows, where)
    n_rows = rows.shape[0]
    pending = None
    if record:
        block = rows
        if rows.device.type != "cpu":
            block = host if host is not None else torch.empty(rows.shape, dtype=torch.float32)
            block.copy_(rows)  # the one device->host copy of the step
        pending = _start_digests(block)  # hashed in threads while the device chooses
    # CPU: rows a few at a time, so that the float64 temporaries stay in the caches (a whole
    # [64, 151936] float64 block each op is memory-bound and slower than row by row); CUDA: all
    step = n_rows if rows.device.type != "cpu" else max(1, _CPU_BLOCK // max(1, rows.shape[1]))
    tokens, logprobs = [], []
    for lo in range(0, n_rows, step):
        hi = min(n_rows, lo + step)
        t, lp = _block(rows[lo:hi], requests[lo:hi], positions[lo:hi], record)
        tokens.append(t)
        logprobs += lp or []
    tokens = tokens[0] if len(tokens) == 1 else torch.cat(tokens)
    if not record:
        return tokens, tokens.tolist(), None, None
    return tokens, tokens.tolist(), logprobs, pending()


def _block(rows: torch.Tensor, requests, positions, record: bool):
    """(ids on the device, logprobs or None) of some rows."""
    top = rows.amax(1)
    tokens = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
    greedy = [j for j, p in enumerate(requests) if p.greedy]
    if greedy:
        g = torch.tensor(greedy, device=rows.device)
        tokens[g] = _greedy(rows[g], top[g])
    sampled = [j for j, p in enumerate(requests) if not p.greedy]
    if sampled:
        s = torch.tensor(sampled, device=rows.device)
        tokens[s] = _sample(rows[s], top[s], [requests[j] for j in sampled], [positions[j] for j in sampled])
    return tokens, (_logprobs(rows, top, tokens) if record else None)
