"""The decode phase: every quantized Linear's operands while the model decodes, per step.

Served tokens are made in decode, one token per sequence per step, so every GEMM runs at
M = the batch, where a kernel may pick another configuration than for a long prefill (a
decode tile, a tile chosen by M). Prefill evidence says nothing about that configuration.

DecodePhase runs it on each regime's model with its own scorer and owns the JSON's `decode`
(the prefill keys stay untouched); decode_markdown is the report's "Decode beside prefill".
How the operands are captured and how C7 compares the pair: docs/audit.md#3-decode-phase.
"""

from __future__ import annotations

import time

import torch

from requant.audit.capture import Capture
from requant.audit.catalogue.checks import c7_token_risk, token_risk
from requant.audit.catalogue.matrix import Matrix
from requant.audit.catalogue.scoring import Scorer
from requant.audit.cells import LinearQueue, backend_kernel
from requant.audit.compare import summarize_layers
from requant.audit.moe_combine import E2E_NOTE, e2e_claimed
from requant.audit.phases.prefill import kernel_faults_markdown
from requant.audit.records import Run, Weights
from requant.io.markdown import table
from requant.runtime.cache import generation_capacity

__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_STEPS",
    "DecodePhase",
    "batch_prompts",
    "decode_logits",
    "decode_markdown",
    "decode_operands",
]

DEFAULT_BATCHES = (1, 8)
DEFAULT_STEPS = 4


def batch_prompts(token_lists: list[list[int]], batch: int) -> list[list[int]]:
    """The first `batch` prompts, cycling through the list when it is shorter."""
    return [token_lists[i % len(token_lists)] for i in range(batch)]


def _cache_for(model, tensors, steps):
    return model.new_cache(len(tensors), generation_capacity(max(len(t) for t in tensors) + steps))


def decode_operands(model, token_lists, steps: int):
    """Greedy decode of `steps` tokens (reference engine, the model's backend). Returns
    (operands per step: [{linear: Activations [B, K]}], tokens fed per step [B], logits per
    step [B, vocab])."""
    tensors = model._as_tensors(token_lists)
    cache = _cache_for(model, tensors, steps)
    ops, fed, logits = [], [], []
    with torch.no_grad():
        last = model.prefill(tensors, cache=cache, last_only=True)
        for _ in range(steps):
            tok = torch.argmax(last, dim=-1)
            cap = Capture()
            last = model.decode_step(tok, cache, capture=cap)
            ops.append(cap.operands())
            fed.append(tok)
            logits.append(last)
    return ops, fed, logits


def decode_logits(model, token_lists, fed: list[torch.Tensor]) -> list[torch.Tensor]:
    """The model's decode logits when it is fed the given tokens (teacher-forced)."""
    tensors = model._as_tensors(token_lists)
    cache = _cache_for(model, tensors, len(fed))
    out = []
    with torch.no_grad():
        model.prefill(tensors, cache=cache, last_only=True)
        for tok in fed:
            out.append(model.decode_step(tok, cache))
    return out


def decode_risk(logits_a: list[torch.Tensor], logits_b: list[torch.Tensor]) -> dict:
    """token_risk over every decode step of one batch size."""
    return token_risk(torch.cat(logits_a), torch.cat(logits_b))


class DecodePhase:
    """The decode phase's own scorer and per-layer rows (the prefill keys stay untouched)."""

    def __init__(self, matrix: Matrix, batches: tuple[int, ...], steps: int):
        self.scorer = Scorer(matrix)
        self.batches = tuple(batches)
        self.steps = steps
        self.rows: list = []
        self.e2e: dict = {}
        self.timings: dict = {}
        self.unrouted: dict = {}

    def run(self, regime, model, linears, names, token_lists, backends, advance) -> None:
        t0 = time.perf_counter()
        captured = {}
        for batch in self.batches:
            toks = batch_prompts(token_lists, batch)
            ops, fed, logits_a = decode_operands(model.with_backends(backends[0]), toks, self.steps)
            logits_b = decode_logits(model.with_backends(backends[1]), toks, fed)
            risk = decode_risk(logits_a, logits_b)
            outcome = c7_token_risk(
                Run(None, None, None, None, backend_kernel(backends[0]), logits=torch.cat(logits_a)),
                Run(None, None, None, None, backend_kernel(backends[1]), logits=torch.cat(logits_b)),
                backend_kernel(backends[1]),
            ).outcome
            if e2e_claimed(backends, model):
                expected = self.scorer.add_end_to_end("C7", regime, outcome, observable=not risk["bitwise_equal"])
            else:
                expected, risk["note"] = None, E2E_NOTE
            risk.update({"outcome": outcome, "expected": expected})
            self.e2e.setdefault(regime, {})[str(batch)] = risk
            captured[batch] = ops
        self.timings[f"{regime}_capture_s"] = round(time.perf_counter() - t0, 3)
        # Every (batch, step) operand set of one Linear is evaluated together (audit/batched.py);
        # rows and cells are then recorded in (batch, step, Linear) order, as one step at a time would.
        queue = LinearQueue(regime, backends, self.scorer.checks, advance)
        keys = [(b, t) for b in self.batches for t in range(len(captured[b]))]
        # A Qwen3-MoE expert has operands only at the steps where the router sent it a token;
        # the steps without are counted and an expert with none is named (never counted as equal).
        where: dict[str, dict] = {}
        for name in names:
            present = [(b, t) for b, t in keys if name in captured[b][t]]
            if len(present) < len(keys):
                idle = self.unrouted.setdefault(regime, {"experts": [], "operand_sets_without_tokens": 0})
                idle["operand_sets_without_tokens"] += len(keys) - len(present)
                if not present:
                    idle["experts"].append(name)
                    continue
            where[name] = {k: i for i, k in enumerate(present)}
            labelled = [(f"{name}@b{b}.t{t}", captured[b][t][name]) for b, t in present]
            queue.put(name, labelled, Weights(*linears[name]))
        done = queue.results()
        for batch, step in keys:
            for name in names:
                i = where.get(name, {}).get((batch, step))
                if i is None:
                    continue
                row, cells = done[name][i]
                for cell in cells:
                    self.scorer.add(cell)
                row.update(name=name, batch=batch, step=step)
                self.rows.append(row)
        self.timings[f"{regime}_s"] = round(time.perf_counter() - t0, 3)

    def result(self, keep_cells: bool | str, native_is_pow2: bool = False) -> dict:
        summary = summarize_layers(self.rows, native_is_pow2)
        summary["by_batch"] = {
            str(b): summarize_layers([r for r in self.rows if r["batch"] == b], native_is_pow2) for b in self.batches
        }
        out = {
            "batches": list(self.batches),
            "steps": self.steps,
            "cells": self.scorer.cells,
            "baseline_cells": self.scorer.baseline_cells,
            "per_layer_summary": summary,
            "per_layer": self.rows,
            **self.scorer.summary(),
            "end_to_end": self.e2e,
            "timings": self.timings,
            **({"experts_without_tokens": self.unrouted} if self.unrouted else {}),
        }
        # Decode's cell rows (21 x 2 per Linear, batch size and step: 14,112 on the embedded default,
        # 6 MB of JSON) stay out of the record; the detection table, contradictions and per-layer
        # rows say what they say. keep_cells keeps them.
        if keep_cells == "all":
            out["cell_results"] = self.scorer.rows
        return out


def decode_markdown(result: dict) -> list[str]:
    dec = result.get("decode")
    if not dec:
        return []
    pre, card = result["per_layer_summary"], dec["scorecard"]
    lines = [
        "## Decode beside prefill",
        "",
        f"Decode: {dec['steps']} greedy steps at each batch size M = {', '.join(map(str, dec['batches']))} "
        "(KV cache, reference engine); every step's operands audited at that step's M, never concatenated.",
        "",
    ]
    rows = [["prefill", f"M = {result['tokens']} (packed)", *_regime_cells(pre)]]
    for b, s in dec["per_layer_summary"]["by_batch"].items():
        rows.append(["decode", f"M = {b}, {dec['steps']} steps", *_regime_cells(s)])
    lines += table(
        ["phase", "operands", "pow2 layers bitwise equal", "native layers bitwise equal", "max ULP native"], rows
    )
    lines += [
        "",
        f"Decode scorecard: {dec['cells']} cells, false positives **{card['false_positives']}**, false negatives "
        f"**{card['false_negatives']}**, applicability mismatches {card['applicability_mismatches']} "
        f"(matrix `{card['matrix_sha256'][:12]}`, {'pinned' if card['matrix_pinned'] else 'NOT PINNED'}).",
        "",
    ]
    det = {(d["variant"], d["regime"]): d for d in dec["detection"]}
    pdet = {(d["variant"], d["regime"]): d for d in result["detection"]}
    rows = []
    for (variant, regime), d in det.items():
        p = pdet.get((variant, regime), {"detected": "-", "observable": "-"})
        rows.append([variant, regime, f"{p['detected']}/{p['observable']}", f"{d['detected']}/{d['observable']}"])
    lines += table(["variant", "regime", "prefill detected/observable", "decode detected/observable"], rows)
    lines += kernel_faults_markdown(dec.get("kernel_faults"), "decode")
    e2e = dec.get("end_to_end") or {}
    if e2e:
        lines += ["", "Decode end to end (C7 on the pair's decode logits, same tokens fed):", ""]
        lines += table(
            ["regime", "M", "tokens", "flagged", "top-1 disagreements", "max deviation", "outcome", "expected"],
            [
                [
                    r,
                    b,
                    e["tokens"],
                    e["flagged"],
                    e["top1_disagreements"],
                    e["max_deviation"],
                    e["outcome"],
                    e["expected"] or "no claim",
                ]
                for r, per in e2e.items()
                for b, e in per.items()
            ],
        )
    return lines + [""]


def _regime_cells(s: dict) -> list:
    return [
        f"{s['pow2']['bitwise_equal']}/{s['pow2']['layers']}",
        f"{s['native']['bitwise_equal']}/{s['native']['layers']}",
        s["native"]["max_ulp"],
    ]
