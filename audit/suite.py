"""Runs the audit: capture operands per regime, compare the pair per layer, run the
baseline rows and the 21 fault variants on every layer, score everything.

A Linear's cells are evaluated together (audit/batched.py: every variant, check and decode
step at once on the operands' device, one small tensor read back per window of Linears);
the per-cell path (layer_cells: each cell on its own through audit.faults.reference_case and
audit/checks.py) is the oracle it equals, kept and forced by REQUANT_AUDIT_PER_CELL=1.

Cells: 21 variants x 2 regimes per quantized Linear (a Qwen3-1.7B config: 196 Linears,
8,232 cells). Baseline rows (each backend of the pair as the kernel under test, no fault)
are run on every (layer, regime) too and reported beside the cells, not counted among them.

The decode phase (phases with "decode": audit/decode.py, DecodePhase below) audits each decode
step's operands with its own scorer under the JSON's `decode`; the injection (audit/injection.py)
runs on each regime's model after its cells. Neither touches a prefill key.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from requant import kernels
from requant.audit.batched import Pending, Read, Segment, Started, per_cell_forced, start_linear
from requant.audit.capture import Capture, prompts, run_prompts
from requant.audit.checks import CHECK_IDS, c7_token_risk, run_checks, token_risk
from requant.audit.compare import compare_layer, summarize_layers
from requant.audit.decode import (
    DEFAULT_BATCHES,
    DEFAULT_STEPS,
    batch_prompts,
    decode_logits,
    decode_operands,
    decode_risk,
)
from requant.audit.faults import VARIANTS, LayerCase, inject, reference_case
from requant.audit.linears import AuditLinears
from requant.audit.matrix import REGIMES, Matrix, baseline_variant, load_matrix
from requant.audit.records import (
    BACKEND_KERNELS,
    REFERENCE_KERNEL,
    Activations,
    KernelDesc,
    Run,
    Weights,
    output_distance,
    output_equal,
)
from requant.audit.scoring import CellResult, Scorer, ulp_histogram
from requant.backends import environment
from requant.evidence.identity import checkpoint_identity
from requant.kernels.bf16 import is_power_of_two
from requant.models.qwen3 import Qwen3Arch
from requant.models.tokenizer import load_tokenizer
from requant.runtime import Model, load_dense

CELLS_PER_LAYER = len(VARIANTS) * len(REGIMES)


def plan_from_config(config: dict) -> dict:
    """Cells and shapes from config.json alone (no tensors read)."""
    from requant.checkpoint import is_ignored

    sh = Qwen3Arch.from_config(config)
    ignore = tuple((config.get("quantization_config") or {}).get("ignore") or ())
    shapes = sh.linear_shapes()
    if not is_ignored("lm_head", ignore):
        shapes["lm_head"] = (sh.vocab, sh.hidden)
    shapes = {n: s for n, s in shapes.items() if not is_ignored(n, ignore)}
    distinct: dict[tuple[int, int], int] = {}
    for s in shapes.values():
        distinct[s] = distinct.get(s, 0) + 1
    return {
        "layers": len(shapes),
        "variants": len(VARIANTS),
        "regimes": list(REGIMES),
        "cells": len(shapes) * CELLS_PER_LAYER,
        "shapes": [{"out": o, "in": i, "count": c} for (o, i), c in distinct.items()],
        "linears": {n: list(s) for n, s in shapes.items()},
    }


def backend_kernel(name: str) -> KernelDesc:
    """The documented description of a registered backend (audit.records.BACKEND_KERNELS);
    every backend in kernels/ accumulates in int32 and returns no accumulator. A backend
    registered at run time (a MODULE:FUNCTION kernel) is described by the order it declares
    (kernels.EMULATION_OF); its accumulator is not visible, so int32 is its claim, not a fact."""
    if name in BACKEND_KERNELS:
        return BACKEND_KERNELS[name]
    emu = kernels.EMULATION_OF.get(name)
    order = "unknown" if emu is None else ("exact" if emu == "reference" else emu.removeprefix("reference-"))
    return KernelDesc(name, "int", 32, order, False)


def evaluate_cell(case: LayerCase, variant: str, family: str, severity: str, test: Run, checks=CHECK_IDS) -> CellResult:
    outcomes = {cid: r.outcome for cid, r in run_checks(case.ref, test, checks=checks).items()}
    if output_equal(case.ref, test):
        return CellResult(case.name, case.regime, variant, family, severity, False, 0, 0, outcomes, [])
    dist = output_distance(case.ref, test)
    mism = int((test.y.view(torch.int16) != case.ref.y.view(torch.int16)).sum())
    return CellResult(
        case.name, case.regime, variant, family, severity, True, mism, int(dist.max()), outcomes, ulp_histogram(dist)
    )


def layer_cells(
    name: str, regime: str, act: Activations, wt: Weights, backends: tuple[str, str], checks=CHECK_IDS, outs=None
) -> tuple[dict, list[CellResult]]:
    """The per-cell path (the oracle of audit/batched.py): pair row, baseline rows and the 21
    fault cells of one (layer, regime), each cell evaluated on its own."""
    case = reference_case(name, regime, act, wt)
    if outs is None:
        outs = {b: kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend=b) for b in dict.fromkeys(backends)}
    row = compare_layer(name, regime, outs[backends[0]], outs[backends[1]], case.shape)
    cells = [
        evaluate_cell(case, baseline_variant(b), "B", "none", Run(act, wt, None, outs[b], backend_kernel(b)), checks)
        for b in dict.fromkeys(backends)
    ]
    cells += [evaluate_cell(case, v.id, v.family, v.severity, inject(v, case), checks) for v in VARIANTS]
    return row, cells


def audit_layer(
    name: str,
    regime: str,
    act: Activations,
    wt: Weights,
    backends: tuple[str, str],
    scorer: Scorer,
    advance: Callable[[int], None] | None = None,
) -> dict:
    """Pair comparison, baseline rows and the 21 fault cells of one (layer, regime), per cell."""
    row, cells = layer_cells(name, regime, act, wt, backends, scorer.checks)
    for cell in cells:
        scorer.add(cell)
    if advance is not None:
        advance(len(VARIANTS))
    return row


class LinearQueue:
    """Evaluates Linears through audit/batched.py (or per cell when REQUANT_AUDIT_PER_CELL is set,
    or when a Linear needs it), reading results back once per `window` Linears.

    put(key, labelled, wt): labelled = [(label, Activations)], one per segment; results() then
    maps each key to [(per_layer row, cells)] in segment order."""

    def __init__(self, regime: str, backends: tuple[str, str], checks, advance=None, window: int = 16):
        self.regime, self.backends, self.checks, self.advance, self.window = regime, backends, checks, advance, window
        self.per_cell = per_cell_forced()
        self.queued: list = []
        self.reading: list = []  # (entries, Read): windows whose results are on their way
        self.done: dict = {}

    def put(self, key, labelled: list, wt: Weights) -> None:
        pair = tuple(dict.fromkeys(self.backends))
        outs = [{b: kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend=b) for b in pair} for _, act in labelled]
        work = None
        if not self.per_cell:
            segs = [Segment(label, act, o) for (label, act), o in zip(labelled, outs)]
            work = start_linear(self.regime, segs, wt, self.backends, backend_kernel)
        # The Linear queued before this one reads its counts now: its copy is done or nearly, and the
        # device has this Linear's work queued behind it (no idle device while the host reads).
        self._finish_started()
        if work is None:
            res = [
                layer_cells(label, self.regime, act, wt, self.backends, self.checks, o)
                for (label, act), o in zip(labelled, outs)
            ]
            self.queued.append((key, res, len(labelled)))
        else:
            self.queued.append((key, work, len(labelled)))
        if sum(isinstance(r, (Pending, Started)) for _, r, _ in self.queued) >= self.window:
            self.flush()

    def _finish_started(self) -> None:
        self.queued = [(k, r.finish() if isinstance(r, Started) else r, n) for k, r, n in self.queued]

    def flush(self, wait: bool = False) -> None:
        """Send the queued Linears' results to the host; resolve the window sent before (or, with
        `wait`, every window): the device works on while the host reads and scores."""
        self._finish_started()
        if self.queued:
            self.reading.append((self.queued, Read([r for _, r, _ in self.queued if isinstance(r, Pending)])))
        self.queued = []
        while self.reading and (wait or len(self.reading) > 1):
            entries, read = self.reading.pop(0)
            resolved = iter(read.resolve(self.checks))
            for key, r, n_seg in entries:
                self.done[key] = next(resolved) if isinstance(r, Pending) else r
                if self.advance is not None:
                    self.advance(len(VARIANTS) * n_seg)

    def results(self) -> dict:
        self.flush(wait=True)
        return self.done


def _lap(t: float, device) -> float:
    """Seconds since t, the device's queued work included (a stage's wall time)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return round(time.perf_counter() - t, 3)


def converted_info(config: dict) -> dict | None:
    """The provenance of a checkpoint that `requant convert` made (config.json "requant"), or None.

    Auditing a converted checkpoint audits the arm that was converted: its scales are already
    powers of two, so the native regime (the stored scales) and the pow2 regime (the nearest
    arm applied to them, which leaves a power of two unchanged) are the same operands. Nothing
    is requantized a second time; both regimes report the checkpoint as stored."""
    prov = config.get("requant")
    if not isinstance(prov, dict) or "arm" not in prov:
        return None
    return {
        "arm": prov.get("arm"),
        "servable": prov.get("servable"),
        "source": prov.get("source"),
        "regimes": "native = pow2 = the stored scales (converted checkpoint: no second requantization)",
    }


def run_audit(
    ckpt,
    backends: tuple[str, str],
    n_prompts: int,
    device: str,
    advance=None,
    on_phase=None,
    matrix: Matrix | None = None,
    keep_cells: bool | str = True,
    identity: dict | None = None,
    phases: tuple[str, ...] = ("prefill",),
    decode_batches: tuple[int, ...] = DEFAULT_BATCHES,
    decode_steps: int = DEFAULT_STEPS,
    injection: dict | None = None,
) -> dict:
    """The whole audit on an opened checkpoint; returns the result dict (JSON-ready).

    Args:
        ckpt: a requant.checkpoint.Checkpoint (or alike: config, quantized_linears, tensors).
        backends: the pair of scaled_mm backends compared per layer (requant.backends.parse_backends).
        n_prompts: calibration prompts prefilled to capture each Linear's int8 operands.
        device: torch device the operands and kernels live on.
        advance(n): progress over the cells; on_phase(message): phase lines.
        matrix: the prediction matrix to score against (default: the pinned one).
        keep_cells: keep every prefill cell's result in the output (large at 8B/14B); "all": decode's too.
        identity: checkpoint_identity(ckpt) when the caller computed it already.
        phases: "prefill" (always) and "decode" (audit/decode.py: decode_steps greedy steps at
            each batch size of decode_batches, every step's operands audited at M = the batch).
        injection: None, or the options of audit.injection.run_injection (prompts, tokens,
            one_layer) to inject each fault family into the generating model.
    """
    t0 = time.perf_counter()
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    identity = identity if identity is not None else checkpoint_identity(ckpt)
    matrix = matrix or load_matrix()
    scorer = Scorer(matrix)
    config = ckpt.config
    shape = Qwen3Arch.from_config(config)
    tok = load_tokenizer(getattr(ckpt, "path", None), shape.vocab)
    texts = prompts(n_prompts)
    token_lists = [tok.encode(t) for t in texts]
    say = on_phase or (lambda msg: None)
    say(f"loading dense tensors to {device}")
    dense = load_dense(ckpt, device)
    timings = {"load_dense_s": round(time.perf_counter() - t0, 3)}
    per_layer, e2e = [], {}
    decode = DecodePhase(matrix, decode_batches, decode_steps) if "decode" in phases else None
    inj = {}
    native_pow2_layers = 0
    loader, previous = AuditLinears(ckpt, device), None
    for regime in REGIMES:
        t_r = time.perf_counter()
        say(f"{regime}: loading quantized Linears")
        linears = loader.load(regime, previous)
        previous = None
        timings[f"{regime}_linears_s"] = _lap(t_r, device)
        t_r = time.perf_counter()
        # The reference engine for both backends: the capture records its operands, and the two
        # prefills compared end to end (C7) must differ in the GEMM backend alone.
        model = Model(
            config, dense, linears, regime=regime, path=getattr(ckpt, "path", None), tokenizer=tok, engine="reference"
        )
        say(f"{regime}: prefill of {len(token_lists)} prompts with {backends[0]} (capture) and {backends[1]}")
        cap = Capture()
        logits_a = run_prompts(model, token_lists, backends[0], cap)
        logits_b = run_prompts(model, token_lists, backends[1], None)
        risk = token_risk(logits_a, logits_b)
        # C7 decides from the same logits (it recomputes token_risk: [tokens, vocab], cheap).
        outcome = c7_token_risk(
            Run(None, None, None, None, backend_kernel(backends[0]), logits=logits_a),
            Run(None, None, None, None, backend_kernel(backends[1]), logits=logits_b),
            backend_kernel(backends[1]),
        ).outcome
        expected = scorer.add_end_to_end("C7", regime, outcome, observable=not risk["bitwise_equal"])
        risk.update({"outcome": outcome, "expected": expected})
        e2e[regime] = risk
        ops = cap.operands()
        timings[f"{regime}_capture_s"] = _lap(t_r, device)
        t_c = time.perf_counter()
        say(f"{regime}: cells")
        queue = LinearQueue(regime, backends, scorer.checks, advance)
        pow2_flags = []  # on the device, read once after the cells (no host read per Linear)
        for name in ckpt.quantized_linears:
            wt = Weights(*linears[name])
            if regime == "native":
                pow2_flags.append(is_power_of_two(wt.s_w).all())
            queue.put(name, [(name, ops[name])], wt)
        for name, [(row, cells)] in queue.results().items():
            for cell in cells:
                scorer.add(cell)
            per_layer.append(row)
        if pow2_flags:
            native_pow2_layers += int(torch.stack(pow2_flags).sum())
        timings[f"{regime}_cells_s"] = _lap(t_c, device)
        del ops, cap
        if decode is not None:
            t_d = time.perf_counter()
            say(f"{regime}: decode, batches {','.join(map(str, decode.batches))} x {decode.steps} steps")
            decode.run(regime, model, linears, ckpt.quantized_linears, token_lists, backends, advance)
            timings[f"{regime}_decode_s"] = _lap(t_d, device)
        if injection is not None:
            from requant.audit.injection import run_injection

            t_i = time.perf_counter()
            say(f"{regime}: faults injected into the generating model")
            inj[regime] = run_injection(model, token_lists, backends, **injection)
            timings[f"{regime}_injection_s"] = _lap(t_i, device)
        del model
        # On CUDA the next regime (pow2) is derived on the device from these tensors (audit/linears.py).
        previous = linears if cuda else None
        del linears
    summary = scorer.summary()
    from requant.audit.faults import FAULT_KERNELS

    layers = len(ckpt.quantized_linears)
    converted = converted_info(config)
    if converted is not None:
        converted["scales_all_power_of_two"] = native_pow2_layers == layers
    result = {
        "tool": "requant audit",
        "checkpoint": str(getattr(ckpt, "path", "")),
        **identity,
        "converted": converted,
        "backends": list(backends),
        "device": str(device),
        "prompts": len(texts),
        "tokens": sum(len(t) for t in token_lists),
        "tokenizer": tok.describe(),
        "layers": layers,
        "cells": scorer.cells,
        "variants": len(VARIANTS),
        "regimes": list(REGIMES),
        "baseline_cells": scorer.baseline_cells,
        "native_scales_all_pow2_layers": native_pow2_layers,
        "per_layer": per_layer,
        "per_layer_summary": summarize_layers(per_layer, native_is_pow2=layers > 0 and native_pow2_layers == layers),
        **summary,
        "end_to_end": e2e,
        "kernels": {
            "reference": REFERENCE_KERNEL.as_dict(),
            "backends": {b: backend_kernel(b).as_dict() for b in backends},
            "faults": {f: k.as_dict() for f, k in FAULT_KERNELS.items()},
        },
        "environment": environment(device),
        "timings": timings,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "wall_seconds": round(time.perf_counter() - t0, 3),
    }
    if decode is not None:
        result["decode"] = decode.result(keep_cells, native_is_pow2=layers > 0 and native_pow2_layers == layers)
    if injection is not None:
        from requant.audit.injection import score_injection

        result["injection"], result["injection_scorecard"] = score_injection(inj, injection)
    if keep_cells:
        result["cell_results"] = scorer.rows
    return result


class DecodePhase:
    """The decode phase's own scorer and per-layer rows (the prefill keys stay untouched)."""

    def __init__(self, matrix: Matrix, batches: tuple[int, ...], steps: int):
        self.scorer = Scorer(matrix)
        self.batches = tuple(batches)
        self.steps = steps
        self.rows: list = []
        self.e2e: dict = {}
        self.timings: dict = {}

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
            expected = self.scorer.add_end_to_end("C7", regime, outcome, observable=not risk["bitwise_equal"])
            risk.update({"outcome": outcome, "expected": expected})
            self.e2e.setdefault(regime, {})[str(batch)] = risk
            captured[batch] = ops
        self.timings[f"{regime}_capture_s"] = round(time.perf_counter() - t0, 3)
        # Every (batch, step) operand set of one Linear is evaluated together (audit/batched.py);
        # rows and cells are then recorded in (batch, step, Linear) order, as one step at a time would.
        queue = LinearQueue(regime, backends, self.scorer.checks, advance)
        keys = [(b, t) for b in self.batches for t in range(len(captured[b]))]
        for name in names:
            labelled = [(f"{name}@b{b}.t{t}", captured[b][t][name]) for b, t in keys]
            queue.put(name, labelled, Weights(*linears[name]))
        done = queue.results()
        for i, (batch, step) in enumerate(keys):
            for name in names:
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
        }
        # Decode's cell rows (21 x 2 per Linear, batch size and step: 14,112 on the embedded default,
        # 6 MB of JSON) stay out of the record; the detection table, contradictions and per-layer
        # rows say what they say. keep_cells keeps them.
        if keep_cells == "all":
            out["cell_results"] = self.scorer.rows
        return out
