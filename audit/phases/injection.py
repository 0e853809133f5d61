"""The injection phase: each fault kernel injected into the generating model, C7 measured.

The per-layer suite injects faults into emulations of one GEMM at a time, so it never
shows what a fault does to the tokens a model serves. Here each kernel of
audit/conform/fault_kernels.py (F1..F8, and F9 as its three operand variants F9a, F9b, F9c)
replaces the GEMM of the selected quantized Linears while the runtime (reference engine)
generates greedily, in two scopes: `all` (every quantized Linear) and `one_layer` (the seven
Linears of decoder layer num_hidden_layers // 2), under both scale regimes.

run_injection measures one regime's model; score_injection makes the JSON's `injection` and
`injection_scorecard` (matrix v4's `injection` predictions); injection_markdown and
plot_injection are the report's section and injection.png. How the injector finds its
Linears, and what is measured: docs/audit.md#4-faults-injected-into-the-generating-model.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from pathlib import Path

import torch

from requant import kernels
from requant.audit.catalogue.checks import FIRE, NOT_APPLICABLE, SILENT, token_risk
from requant.audit.catalogue.matrix import INJECTION_MATRIX_PATH, PREDICTED_MISS, load_matrix
from requant.audit.device_acc import exact_accumulate
from requant.audit.phases.lean_faults import device_faults, lean_epilogue
from requant.io.markdown import table
from requant.kernels.bf16 import round_fp32_to_bf16, truncate_fp32_to_bf16
from requant.regime import REGIMES
from requant.runtime.cache import generation_capacity

__all__ = [
    "INJECTOR",
    "SCOPES",
    "FaultInjector",
    "base_backend",
    "device_faults",
    "injection_markdown",
    "one_layer_names",
    "plot_injection",
    "run_injection",
    "score_injection",
]

INJECTOR = "audit-fault-injector"
SCOPES = ("all", "one_layer")
DEFAULT_TOKENS = {"cpu": 8, "cuda": 32}
RUNS = 22  # teacher-forced runs per regime: 11 fault kernels x 2 scopes
BATCH_ROWS = 256  # batched (CUDA): runs per batch so that runs x prompts stays within this (one run at least)


def runs_per_batch(prompts: int, batched: bool) -> int:
    """How many of the RUNS teacher-forced runs go in one batch of prompts x that many rows."""
    return max(1, min(RUNS, BATCH_ROWS // max(prompts, 1))) if batched else 1


class FaultInjector:
    """fn(a, w, s_a, s_w): the fault kernel for weights in `targets` (by data_ptr), else the base.
    With `blocks` ([(fault, targets)], one per run), the rows are that many equal blocks, one run's
    each (_teacher_forced_blocks): a block's fault kernel sees its block's rows alone, exactly the
    call its own run would make. A built-in base takes the other blocks' rows in one call (a
    built-in computes a row from that row alone: exact int32 accumulator, elementwise epilogue);
    a user's kernel as the base is not trusted with that (it may depend on M), so it too gets
    each block's rows alone."""

    def __init__(self, base: str):
        self.base = base
        self.rows_alone = str(base) in kernels.scaled_mm_backends()
        self.fault = None
        self.targets: set[int] = set()
        self.blocks: list | None = None
        self._bounds: list[int] | None = None  # the blocks' row bounds within rows_of; else equal blocks
        self._rest: dict = {}  # (rows per block, faulted blocks) -> index of the base rows, on the device

    def __call__(self, a, w, s_a, s_w):
        if self.blocks is not None:
            return self._by_block(a, w, s_a, s_w)
        if self.fault is not None and w.data_ptr() in self.targets:
            return self.fault(a, w, s_a, s_w)
        return self._base(a, w, s_a, s_w)

    def _base(self, a, w, s_a, s_w):
        return kernels.scaled_mm(a, w, s_a, s_w, backend=self.base)

    def _faulted_at_once(self, a, w, s_a, s_w, hit, bounds, out) -> bool:
        """The faulted blocks, their rows consecutive, whose kernels all give their last fp32 value
        (lean_faults: `last`): one exact accumulator for all their rows (exact integers: any row split
        gives the same bits), each block's last value from its rows, one bf16 cast for them all
        (elementwise: the same bits as each block's own), the truncating ones cast apart; the blocks
        whose kernels end with the Triton-order epilogue (`last_operands`) share one call of it.
        False: not applicable."""
        fns = [self.blocks[j][0] for j in hit]
        if len(hit) < 2 or not all(hasattr(f, "last") for f in fns):
            return False
        lo, hi = bounds[hit[0]], bounds[hit[-1] + 1]
        if sum(bounds[j + 1] - bounds[j] for j in hit) != hi - lo:  # another block's rows between them
            return False
        acc = exact_accumulate(a[lo:hi], w)
        vals, tri = [None] * len(fns), []
        for i, (j, fn) in enumerate(zip(hit, fns)):
            rows, at = slice(bounds[j], bounds[j + 1]), slice(bounds[j] - lo, bounds[j + 1] - lo)
            ops = fn.last_operands(a[rows], w, s_a[rows], s_w, acc[at]) if hasattr(fn, "last_operands") else None
            if ops is None:
                vals[i] = fn.last(a[rows], w, s_a[rows], s_w, acc[at])
            else:
                tri.append((i, *ops))
        if tri:  # one Triton-order epilogue for the blocks that end with it (elementwise: the same bits)
            tri.sort(key=lambda t: t[1].dtype != torch.int32)  # the int32 accumulators first, cast at once
            ints = [t[1] for t in tri if t[1].dtype == torch.int32]
            accs = ([torch.cat(ints).to(torch.float32)] if ints else []) + [t[1] for t in tri[len(ints) :]]
            y = lean_epilogue(torch.cat(accs), torch.cat([t[2].reshape(-1) for t in tri]), s_w)
            at = 0
            for i, acc_i, _ in tri:
                vals[i] = y[at : at + acc_i.shape[0]]
                at += acc_i.shape[0]
        out[lo:hi] = round_fp32_to_bf16(torch.cat(vals))
        for j, fn, v in zip(hit, fns, vals):
            if fn.truncates:
                out[bounds[j] : bounds[j + 1]] = truncate_fp32_to_bf16(v)
        return True

    @contextmanager
    def rows_of(self, rows: torch.Tensor, total: int):
        """Calls within get the rows `rows` (ascending) of a batch of `total` rows: the MoE block's
        experts, each given the tokens routed to it (DeviceLinears.rows_of). Batched, a block's rows
        there are as many as its own run routes to the expert, in its run's order: the blocks' bounds
        (one host read), and a block with none makes no call, as its run would make none."""
        if self.blocks is None:
            yield
            return
        n = len(self.blocks)
        per, left = divmod(total, n)
        assert left == 0, (total, n)
        counts = torch.bincount(torch.div(rows, per, rounding_mode="floor"), minlength=n).tolist()
        saved, self._bounds = self._bounds, [0, *itertools.accumulate(counts)]
        try:
            yield
        finally:
            self._bounds = saved

    def shared_input(self, a, s_a, weights):
        """Several Linears of one input a (the engine's q/k/v, gate/up; weights [(w, s_w)]), the
        same bits as one call each. Batched, with a built-in base, and where every run faults all
        of them or none: one call on the weights stacked along N. Every output element then reads
        its own weight row and scale only (the exact int32 accumulator, F6's K tiles per element,
        elementwise epilogues, F9's operand draws made from a alone: the fault kernels that say
        so, `columnwise`), so the stacking changes no bit; the fault kernels run once per layer's
        q/k/v instead of three times. A user's base kernel, or a fault kernel that does not say so
        (it may depend on N or on an element's position), gets one call per Linear."""
        hits = {self._hit(w.data_ptr()) for w, _ in weights} if self.blocks is not None else ()
        if len(hits) != 1 or not self.rows_alone:
            return [self(a, w, s_a, s_w) for w, s_w in weights]
        (hit,) = hits
        if not all(getattr(self.blocks[j][0], "columnwise", False) for j in hit):
            return [self(a, w, s_a, s_w) for w, s_w in weights]
        w = torch.cat([w for w, _ in weights])
        s_w = torch.cat([s for _, s in weights])
        out = self._by_block(a, w, s_a, s_w, hit=hit)
        return [y.contiguous() for y in torch.split(out, [w.shape[0] for w, _ in weights], dim=1)]

    def _hit(self, ptr: int) -> tuple[int, ...]:
        return tuple(j for j, (_, targets) in enumerate(self.blocks) if ptr in targets)

    def _by_block(self, a, w, s_a, s_w, hit=None):
        n = len(self.blocks)
        if self._bounds is None:
            r, left = divmod(a.shape[0], n)
            assert left == 0, (a.shape, n)
            bounds = [j * r for j in range(n + 1)]
        else:
            bounds = self._bounds
            assert bounds[-1] == a.shape[0], (a.shape, bounds)
        if hit is None:
            hit = self._hit(w.data_ptr())
        hit = tuple(j for j in hit if bounds[j] < bounds[j + 1])
        if not hit and self.rows_alone:
            return self._base(a, w, s_a, s_w)
        out = torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16, device=a.device)
        done = hit if self._faulted_at_once(a, w, s_a, s_w, hit, bounds, out) else ()
        for j in range(n):
            lo, hi = bounds[j], bounds[j + 1]
            if lo < hi and j not in done and (j in hit or not self.rows_alone):
                fn = self.blocks[j][0] if j in hit else self._base
                out[lo:hi] = fn(a[lo:hi], w, s_a[lo:hi], s_w)
        if self.rows_alone and bounds[-1] > sum(bounds[j + 1] - bounds[j] for j in hit):
            idx = self._rest_rows(bounds, hit, a.device)
            out[idx] = self._base(a[idx], w, s_a[idx], s_w)
        return out

    def _rest_rows(self, bounds: list[int], hit: tuple[int, ...], device) -> torch.Tensor:
        """The rows of the blocks not in hit (the base's), on the device; kept for equal blocks (the
        same few keys every step), made afresh for an expert's (rows_of: bounds vary per call)."""
        key = (tuple(bounds), hit)
        idx = self._rest.get(key)
        if idx is None:
            rows = [i for j in range(len(bounds) - 1) if j not in hit for i in range(bounds[j], bounds[j + 1])]
            idx = torch.tensor(rows, dtype=torch.long).to(device)
            if self._bounds is None:
                self._rest[key] = idx
        return idx


def base_backend(backends: tuple[str, str]) -> str:
    for b in backends:
        if kernels.emulation_of(b) == "reference-triton-order":
            return b
    return "reference-triton-order"


def one_layer_names(model) -> list[str]:
    prefix = f"model.layers.{model.arch.layers // 2}."
    return [n for n in model.linears if n.startswith(prefix)]


def _greedy(model, tensors, tokens: int, fed: list[torch.Tensor] | None = None):
    """(logits per position [B, vocab], fed tokens per step): greedy, or fed the given tokens."""

    cache = model.new_cache(len(tensors), generation_capacity(max(len(t) for t in tensors) + tokens))
    logits, chosen = [], []
    with torch.no_grad():
        last = model.prefill(tensors, cache=cache, last_only=True)
        for t in range(tokens):
            logits.append(last)
            tok = torch.argmax(last, dim=-1) if fed is None else fed[t]
            chosen.append(tok)
            if t < tokens - 1:
                last = model.decode_step(tok, cache)
    return logits, chosen


def _measure(ref_logits, ref_tokens, logits) -> dict:
    got = torch.stack([torch.argmax(x, dim=-1) for x in logits], dim=1)  # [B, T]
    want = torch.stack(ref_tokens, dim=1)
    flips = got != want
    first = [int(row.nonzero()[0]) if bool(row.any()) else None for row in flips]
    risk = token_risk(torch.cat(ref_logits), torch.cat(logits))
    dev = max(float((a - b).abs().max()) for a, b in zip(ref_logits, logits))
    return {
        "prompts": int(flips.shape[0]),
        "changed_prompts": sum(f is not None for f in first),
        "first_divergence": min((f for f in first if f is not None), default=None),
        "first_divergence_by_prompt": first,
        "logit_max_abs": dev,
        "tokens": risk["tokens"],
        "c7_flagged": risk["flagged"],
        "c7_top1_flips": risk["top1_disagreements"],
        "c7": FIRE if risk["flagged"] else SILENT,
        "logits_bitwise_equal": risk["bitwise_equal"],
    }


def _teacher_forced_blocks(m, injector, tensors, tokens, ref_tokens, runs) -> list[list[torch.Tensor]]:
    """The teacher-forced runs `runs` ([(fault kernel, targets)]) as one batch: the prompts once per
    run, each run's block of rows faulted by its own kernel (FaultInjector.blocks). The logits per
    step of each run, the same bits as running it alone: the reference engine computes every row
    from its own sequence (batch-invariant by construction: kernels/ops.py), each block's fault
    kernel is called on exactly the rows its own run would pass, and the base on the rest."""
    n, b = len(runs), len(tensors)
    injector.blocks = list(runs)
    try:
        fed = [torch.cat([t] * n) for t in ref_tokens]
        logits, _ = _greedy(m, tensors * n, tokens, fed=fed)
    finally:
        injector.blocks = None
    return [[x[j * b : (j + 1) * b] for x in logits] for j in range(n)]


def run_injection(
    model,
    token_lists,
    backends: tuple[str, str],
    tokens: int | None = None,
    prompts: int | None = None,
    batched: bool | None = None,
):
    """Every fault kernel in both scopes on one regime's model: {fault: {scope: measures}}.
    batched (default: on CUDA): the 22 teacher-forced runs as one batch (_teacher_forced_blocks),
    the same JSON; without, one after another (the oracle: tests/audit/phases/test_injection.py)."""
    tokens = tokens or DEFAULT_TOKENS["cuda" if model.device.type == "cuda" else "cpu"]
    batched = model.device.type == "cuda" if batched is None else batched
    toks = token_lists if prompts is None else token_lists[:prompts]
    injector = FaultInjector(base_backend(backends))
    try:  # the injector is this run's kernel (kernels.ScaledMM), registered nowhere
        m = model.with_backends(kernels.ScaledMM(INJECTOR, injector, "triton-order"), engine="reference")
        tensors = m._as_tensors(toks)
        ref_logits, ref_tokens = _greedy(m, tensors, tokens)
        scopes = {
            "all": {m.linears[n][0].data_ptr() for n in m.linears},
            "one_layer": {m.linears[n][0].data_ptr() for n in one_layer_names(m)},
        }
        # scope-major: a Linear's faulted blocks are consecutive (FaultInjector._faulted_at_once); the JSON
        # keeps the fault-major order (out is filled below in FAULTS' order, `all` first)
        faults = device_faults(model.device)
        runs = [(fault, scope, faults[fault]) for scope in scopes for fault in faults]
        blocks = []
        if batched:
            per = runs_per_batch(len(tensors), True)
            for g in range(0, len(runs), per):
                group = [(fn, scopes[scope]) for _, scope, fn in runs[g : g + per]]
                blocks += _teacher_forced_blocks(m, injector, tensors, tokens, ref_tokens, group)
        measured = {}
        for i, (fault, scope, fn) in enumerate(runs):
            if batched:
                logits = blocks[i]
            else:
                injector.fault, injector.targets = fn, scopes[scope]
                logits, _ = _greedy(m, tensors, tokens, fed=ref_tokens)
            measured[(fault, scope)] = _measure(ref_logits, ref_tokens, logits)
        out = {fault: {scope: measured[(fault, scope)] for scope in scopes} for fault in faults}
        injector.fault = None
        return {
            "faults": out,
            "reference_tokens": torch.stack(ref_tokens, dim=1).tolist(),
            "base": injector.base,
            "tokens": tokens,
            "prompts": len(toks),
            "one_layer": one_layer_names(m),
        }
    finally:
        injector.fault = None


def score_injection(by_regime: dict, options: dict | None = None) -> tuple[dict, dict]:
    """The JSON's `injection` ({FAULT: {regime: {measures of scope all, one_layer: {...}}}})
    and its scorecard against the injection predictions of matrix v4 (INJECTION_MATRIX_PATH) (same FP/FN rules as C7)."""
    matrix = load_matrix(INJECTION_MATRIX_PATH)
    fp = fn = mism = scored = 0
    contradictions = []
    by_fault: dict = {}
    meta = {}
    for regime, run in by_regime.items():
        meta[regime] = {k: v for k, v in run.items() if k != "faults"}
        for fault, scopes in run["faults"].items():
            entry = by_fault.setdefault(fault, {}).setdefault(regime, {})
            for scope, meas in scopes.items():
                exp = matrix.injection.get(("C7", fault, regime, scope))
                meas = dict(meas, expected=exp)
                got = meas["c7"]
                observable = not meas["logits_bitwise_equal"]
                kind = None
                if exp is not None:
                    scored += 1
                    if (got == NOT_APPLICABLE) != (exp == NOT_APPLICABLE):
                        kind, mism = "applicability", mism + 1
                    elif got == FIRE and exp in (SILENT, PREDICTED_MISS):
                        kind, fp = "false_positive", fp + 1
                    elif got == SILENT and exp == FIRE and observable:
                        kind, fn = "false_negative", fn + 1
                if kind:
                    contradictions.append(
                        {"kind": kind, "fault": fault, "regime": regime, "scope": scope, "expected": exp, "got": got}
                    )
                if scope == "all":
                    entry.update(meas)
                else:
                    entry[scope] = meas
    card = {
        "false_positives": fp,
        "false_negatives": fn,
        "applicability_mismatches": mism,
        "scored": scored,
        "matrix_sha256": matrix.sha256,
        "matrix_version": matrix.version,
        "matrix_pinned": matrix.pinned,
        "contradictions": contradictions,
        "runs": meta,
        "options": dict(options or {}),
    }
    return by_fault, card


def injection_markdown(result: dict) -> list[str]:
    inj, card = result.get("injection"), result.get("injection_scorecard")
    if not inj:
        return []
    runs = card["runs"]
    any_run = next(iter(runs.values()))
    lines = [
        "## Faults injected into the generating model",
        "",
        f"Each fault kernel (audit/fault_kernels.py) replaced the GEMM of every quantized Linear (`all`) or of the "
        f"Linears of one decoder layer (`one layer`: {', '.join(f'`{n}`' for n in any_run['one_layer'])}) while the "
        f"model generated {any_run['tokens']} greedy tokens for {any_run['prompts']} prompts (base backend "
        f"`{any_run['base']}`, fed the unfaulted run's tokens). C7 compares the faulted logits with the unfaulted ones.",
        "",
        f"Injection scorecard (matrix v{card['matrix_version']} `{card['matrix_sha256'][:12]}`, "
        f"{'pinned' if card['matrix_pinned'] else 'NOT PINNED'}): {card['scored']} scored verdicts, false positives "
        f"**{card['false_positives']}**, false negatives **{card['false_negatives']}**.",
        "",
    ]
    rows = []
    for fam, regs in inj.items():
        for r in REGIMES:
            m = regs.get(r)
            if m is None:
                continue
            o = m["one_layer"]
            rows.append(
                [
                    fam,
                    r,
                    f"{m['changed_prompts']}/{m['prompts']}",
                    "-" if m["first_divergence"] is None else m["first_divergence"],
                    f"{m['logit_max_abs']:.4g}",
                    f"{m['c7_flagged']}/{m['tokens']}",
                    m["c7_top1_flips"],
                    m["expected"] or "no claim",
                    f"{o['changed_prompts']}/{o['prompts']}",
                    f"{o['logit_max_abs']:.4g}",
                    f"{o['c7_flagged']}/{o['tokens']}",
                    o["expected"] or "no claim",
                ]
            )
    lines += table(
        [
            "fault",
            "regime",
            "prompts changed",
            "first divergence",
            "max logit deviation",
            "C7 flagged",
            "top-1 flips",
            "C7 expected",
            "one layer: changed",
            "one layer: deviation",
            "one layer: flagged",
            "one layer: expected",
        ],
        rows,
    )
    if card["contradictions"]:
        lines += [
            "",
            "Contradictions: "
            + "; ".join(f"{c['kind']} {c['fault']} {c['regime']} {c['scope']}" for c in card["contradictions"]),
        ]
    return lines + [""]


def plot_injection(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    inj = result["injection"]
    fams = list(inj)
    x = np.arange(len(fams))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for off, (r, scope) in zip((-0.3, -0.1, 0.1, 0.3), [(r, s) for r in REGIMES for s in ("all", "one_layer")]):
        pick = [inj[f].get(r, {}) for f in fams]
        pick = [m if scope == "all" else m.get("one_layer", {}) for m in pick]
        dev = [m.get("logit_max_abs", 0.0) for m in pick]
        flagged = [m.get("c7_flagged", 0) / max(m.get("tokens", 1), 1) for m in pick]
        axes[0].bar(x + off, dev, width=0.2, label=f"{r}, {scope}")
        axes[1].bar(x + off, flagged, width=0.2, label=f"{r}, {scope}")
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[0].set_title("largest logit deviation from the unfaulted run")
    axes[1].set_title("fraction of generated tokens C7 flags")
    for ax in axes:
        ax.set_xticks(x, fams, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("faults injected into the generating model")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path
