"""Bitwise invariance checks of a Model: one sequence's logits by independent paths (prefilled
whole, extended in chunks after a cached prefix, decoded a token at a time), a prompt alone against
its row of a batch, CUDA graphs against eager launches, one backend against another. Each check
returns a Verdict: how many positions, prompts or steps were compared, how many have the same bits,
and where the first difference is.

    piecewise_logits(model, seq, pieces, capacity)   the chunked / decoded path; pieces(...) builds one
    alone_rows(model, prompts), batch_rows(model, prompts)
    compare_positions, compare_items, compare_generations   -> Verdict
    prefill_chunks_decode, alone_vs_batch_prefill, alone_vs_batch_decode, graph_vs_eager, between
    check(model, prompts, seq, pieces, capacity, steps, alone, other_backend)   all of them

Used by the GPU tests (tests/requant/runtime/test_fast_gpu.py) and the fast engine's benchmark
(benchmarks/_runtime_fast.py); the properties: docs/runtime.md, "Split-KV attention" and "INVARIANCE".
Only the Model's public methods are called (prefill, extend, decode_step, new_cache, generate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = [
    "Verdict",
    "alone_rows",
    "alone_vs_batch_decode",
    "alone_vs_batch_prefill",
    "batch_rows",
    "between",
    "check",
    "compare_generations",
    "compare_items",
    "compare_positions",
    "graph_vs_eager",
    "piecewise_logits",
    "pieces",
    "prefill_chunks_decode",
]

_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Verdict:
    """`identical` of `compared` units ("positions", "prompts" or "steps") have the same bits.
    first: the first difference (its coordinates: position / prompt / step, and `logit`, the first
    differing vocabulary entry, with both values' bits as hex), None when there is none. ids:
    generations only, (prompts with the same new ids, prompts)."""

    name: str
    unit: str
    compared: int
    identical: int
    first: dict | None = None
    ids: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return (
            self.identical == self.compared and self.first is None and (self.ids is None or self.ids[0] == self.ids[1])
        )

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        s = f"{self.name}: {self.identical}/{self.compared} {self.unit} identical"
        if self.ids is not None:
            s += f", new ids identical for {self.ids[0]}/{self.ids[1]} prompts"
        if self.first is not None:
            s += ", first difference at " + ", ".join(f"{k} {v}" for k, v in self.first.items())
        return s


# -- comparing ---------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(_INT[t.element_size()]).cpu()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _where(got: torch.Tensor, want: torch.Tensor) -> dict:
    """The first differing element of two tensors of one row or more: {"row", "logit", bits}."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return {"shape": f"{tuple(got.shape)} {got.dtype} != {tuple(want.shape)} {want.dtype}"}
    g, w = _bits(got).reshape(-1, got.shape[-1]), _bits(want).reshape(-1, want.shape[-1])
    row, col = (g != w).nonzero()[0].tolist()
    mask = (1 << (8 * got.element_size())) - 1
    return {
        "row": row,
        "logit": col,
        "got": f"0x{int(g[row, col]) & mask:0{2 * got.element_size()}x}",
        "want": f"0x{int(w[row, col]) & mask:0{2 * got.element_size()}x}",
    }


def compare_positions(name: str, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    """got, want: logits [positions, vocab] of one sequence; `want` is the reference."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return Verdict(name, "positions", len(want), 0, _where(got, want))
    same = (_bits(got) == _bits(want)).all(-1)
    first = None
    if not bool(same.all()):
        pos = int((~same).nonzero()[0])
        where = _where(got[pos], want[pos])
        where.pop("row")
        first = {"position": pos, **where}
    return Verdict(name, "positions", len(want), int(same.sum()), first)


def compare_items(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> Verdict:
    """Per prompt: got[i] against the reference want[i] (logits [T_i, vocab] or [vocab])."""
    first, identical = None, 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if _same(g, w):
            identical += 1
        elif first is None:
            where = _where(g, w)
            row = where.pop("row", None)
            first = {"prompt": i, **({"position": row} if row is not None and w.dim() > 1 else {}), **where}
    return Verdict(name, "prompts", len(want), identical, first)


def compare_generations(name: str, got, want, rows: list[int] | None = None) -> Verdict:
    """Two Generations (keep_logits=True) of the same prompts, `want` the reference, step by step:
    a step is identical when its logits [B, vocab] have the same bits. rows: compare got's rows
    against these rows of want (got alone, want a batch); None: all rows, in order."""
    rows = list(range(len(want.ids))) if rows is None else rows
    ids_same = sum(got.ids[i] == want.ids[r] for i, r in enumerate(rows))
    first, identical = None, 0
    steps = len(want.step_logits)
    for s in range(steps):
        w = want.step_logits[s][rows]
        g = got.step_logits[s] if s < len(got.step_logits) else None
        if g is not None and _same(g, w):
            identical += 1
        elif first is None:
            where = _where(g, w) if g is not None else {"missing": "no logits"}
            row = where.pop("row", None)
            first = {"step": s, **({"prompt": row} if row is not None else {}), **where}
    if first is None and ids_same != len(rows):
        i = next(i for i, r in enumerate(rows) if got.ids[i] != want.ids[r])
        first = {"prompt": i, "ids": f"{got.ids[i]} != {want.ids[rows[i]]}"}
    return Verdict(name, "steps", steps, identical, first, (ids_same, len(rows)))


# -- the paths ---------------------------------------------------------------------------------


def pieces(length: int, prefix: int, chunks) -> list[tuple[str, int]]:
    """A cached prefix, then chunks of the given sizes, then one decode step per remaining token."""
    rest = length - prefix - sum(chunks)
    if rest < 0:
        raise ValueError(f"prefix {prefix} + chunks {sum(chunks)} > {length} tokens")
    return [("extend", prefix)] + [("extend", c) for c in chunks] + [("decode", rest)]


def piecewise_logits(model, seq: torch.Tensor, plan, capacity: int) -> torch.Tensor:
    """Logits [len(seq), vocab] of one sequence fed through one cache row as `plan` says: ("extend",
    n) appends the next n tokens in one chunk (model.extend), ("decode", n) the next n one
    model.decode_step at a time."""
    seq = torch.as_tensor(seq, dtype=torch.long).reshape(-1)
    cache = model.new_cache(1, capacity)
    parts, i = [], 0
    with torch.no_grad():
        for kind, n in plan:
            if kind == "extend":
                parts.append(model.extend([seq[i : i + n]], cache))
                i += n
            elif kind == "decode":
                for _ in range(n):
                    parts.append(model.decode_step(seq[i : i + 1], cache))
                    i += 1
            else:
                raise ValueError(f"plan step {kind!r}: expected 'extend' or 'decode'")
    if i != len(seq):
        raise ValueError(f"the plan covers {i} of {len(seq)} tokens")
    return torch.cat(parts)


def batch_rows(model, prompts) -> list[torch.Tensor]:
    """Logits [T_i, vocab] per prompt, all prompts in one packed prefill."""
    ts = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    with torch.no_grad():
        return list(torch.split(model.prefill(ts), [len(t) for t in ts]))


def alone_rows(model, prompts) -> list[torch.Tensor]:
    """Logits [T_i, vocab] per prompt, each prompt prefilled on its own."""
    return [batch_rows(model, [p])[0] for p in prompts]


# -- the checks (reference: the first path named) -----------------------------------------------


def prefill_chunks_decode(model, seq, plan, capacity: int) -> Verdict:
    """The sequence prefilled whole (the reference) against `plan`'s chunks and decode steps."""
    whole = batch_rows(model, [seq])[0]
    return compare_positions("prefill_chunks_decode", piecewise_logits(model, seq, plan, capacity), whole)


def alone_vs_batch_prefill(model, prompts) -> Verdict:
    """The prompts prefilled in one batch (the reference) against each alone."""
    return compare_items("alone_vs_batch_prefill", alone_rows(model, prompts), batch_rows(model, prompts))


def alone_vs_batch_decode(model, prompts, steps: int, which, batch=None, graphs: bool = True) -> Verdict:
    """The prompts generated in one batch (`batch`, or generated here; the reference) against the
    prompts `which` each generated alone: a prompt is identical when its new ids and every step's
    logits row are."""
    if batch is None:
        batch = model.generate(prompts, steps, keep_logits=True, graphs=graphs)
    first, identical = None, 0
    for j in which:
        alone = model.generate([prompts[j]], steps, keep_logits=True, graphs=graphs)
        v = compare_generations("", alone, batch, rows=[j])
        if v.ok:
            identical += 1
        elif first is None:
            first = {"prompt": j, **{k: x for k, x in v.first.items() if k != "prompt"}}
    return Verdict("alone_vs_batch_decode", "prompts", len(which), identical, first)


def graph_vs_eager(model, prompts, steps: int):
    """generate with CUDA graphs against eager launches (the reference); also returns the graph run."""
    g = model.generate(prompts, steps, keep_logits=True, graphs=True)
    e = model.generate(prompts, steps, keep_logits=True, graphs=False)
    return compare_generations("graph_vs_eager", g, e), g


def between(model, other, prompts, steps: int) -> tuple[Verdict, Verdict]:
    """Two models (e.g. two backends) on the same prompts: generations step by step and prefill
    logits per prompt, `model` the reference."""
    name = f"{model.backend}_vs_{other.backend}"
    a = other.generate(prompts, steps, keep_logits=True)
    b = model.generate(prompts, steps, keep_logits=True)
    return compare_generations(name, a, b), compare_items(
        name + "_prefill", batch_rows(other, prompts), batch_rows(model, prompts)
    )


def check(
    model, prompts, seq, plan, capacity: int, steps: int, alone, other_backend: str | None = None, other_steps=None
) -> dict:
    """Every check above, the benchmark's procedure: {check: Verdict} (graph_vs_eager,
    prefill_chunks_decode, alone_vs_batch_prefill, alone_vs_batch_decode; other_backend and
    other_backend_prefill with an other backend). prompts: generated `steps`
    tokens with graphs and eagerly, prefilled alone and in a batch; `alone`: the prompts also
    generated alone; seq: prefilled whole against `plan` in a cache of `capacity`; other_backend:
    model.with_backends(other_backend) against model, `other_steps` tokens (default `steps`)."""
    out = {}
    out["graph_vs_eager"], graphed = graph_vs_eager(model, prompts, steps)
    out["prefill_chunks_decode"] = prefill_chunks_decode(model, seq, plan, capacity)
    out["alone_vs_batch_prefill"] = alone_vs_batch_prefill(model, prompts)
    out["alone_vs_batch_decode"] = alone_vs_batch_decode(model, prompts, steps, alone, batch=graphed)
    if other_backend:
        out["other_backend"], out["other_backend_prefill"] = between(
            model, model.with_backends(other_backend), prompts, other_steps or steps
        )
    return out
