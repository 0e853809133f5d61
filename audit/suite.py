"""Runs the audit: each scale regime's Linears loaded and its model built once, then every phase
on it in order (audit/phases/: prefill, decode when asked, injection when asked), and the result
dict (the JSON) assembled from their sections. The cells of one Linear: audit/cells.py.
Docs: docs/architecture.md (audit), docs/audit.md.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import ContextDecorator

import torch

from requant.audit.capture import prompts
from requant.audit.catalogue.faults import FAULT_KERNELS, VARIANTS
from requant.audit.catalogue.matrix import Matrix, load_matrix
from requant.audit.cells import CELLS_PER_LAYER, backend_kernel
from requant.audit.linears import AuditLinears
from requant.audit.phases.decode import DEFAULT_BATCHES, DEFAULT_STEPS, DecodePhase
from requant.audit.phases.injection import run_injection, score_injection
from requant.audit.phases.prefill import PrefillPhase
from requant.audit.records import REFERENCE_KERNEL
from requant.backends import environment
from requant.checkpoint import is_ignored
from requant.evidence.identity import checkpoint_identity
from requant.models.qwen3 import Qwen3Arch
from requant.models.qwen3_moe import arch_of
from requant.models.tokenizer import load_tokenizer
from requant.regime import REGIMES
from requant.runtime import Model, load_dense

__all__ = ["collector_paused", "converted_info", "plan_from_config", "run_audit"]


class collector_paused(ContextDecorator):  # noqa: N801 (used as a context, like contextlib's)
    """Python's cyclic garbage collector off for the block, as it was after. The audit keeps
    millions of small objects alive (a 30B-A3B audit: 1.7 M cell results) and every full collection
    walks them all: on a 4-layer 128-expert synthetic the host's time in resolving cells was 0.68 s
    with the collector on and 0.14 s off. The audit makes few reference cycles (peak RSS +3% with
    the collector off for the whole run); reference counting frees everything else as usual."""

    def __enter__(self):
        self._was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self._was:
            gc.enable()
        return False


def plan_from_config(config: dict) -> dict:
    """Cells and shapes from config.json alone (no tensors read)."""

    sh = arch_of(config)  # Qwen3-MoE: every expert Linear is a layer of its own; routers are ignored
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


# triton: the capture's per-token activation quantization through the Triton kernel on CUDA (one
# launch a call; the reference quantizer is ~20 torch ops) instead of kernels/reference.py's. The two
# are tested equal bit for bit; this is the A/B that measures what it saves and that the JSON stays
# the same (the JSON then names it: `activation_quantizer`). Default: the reference quantizer.
ACT_ENV = "REQUANT_AUDIT_ACT"
ACT_BACKENDS = ("reference", "triton")


def activation_quantizer(device) -> str:
    """The activation quantizer the audit's reference engine uses (ACT_ENV; ValueError naming it)."""
    act = os.environ.get(ACT_ENV, "reference")
    if act not in ACT_BACKENDS:
        raise ValueError(f"{ACT_ENV}={act!r}: expected one of {', '.join(ACT_BACKENDS)}")
    if act == "triton" and torch.device(device).type != "cuda":
        raise ValueError(f"{ACT_ENV}=triton needs a CUDA device (the audit runs on {device})")
    return act


@collector_paused()
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
        phases: "prefill" (always) and "decode" (audit/phases/decode.py: decode_steps greedy steps at
            each batch size of decode_batches, every step's operands audited at M = the batch).
        injection: None, or the options of audit.phases.injection.run_injection (prompts, tokens,
            one_layer) to inject each fault family into the generating model.
    """
    t0 = time.perf_counter()
    act = activation_quantizer(device)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    identity = identity if identity is not None else checkpoint_identity(ckpt)
    matrix = matrix or load_matrix()
    config = ckpt.config
    shape = Qwen3Arch.from_config(config)
    tok = load_tokenizer(getattr(ckpt, "path", None), shape.vocab)
    texts = prompts(n_prompts)
    token_lists = [tok.encode(t) for t in texts]
    say = on_phase or (lambda msg: None)
    say(f"loading dense tensors to {device}")
    dense = load_dense(ckpt, device)
    timings = {"load_dense_s": round(time.perf_counter() - t0, 3)}
    prefill = PrefillPhase(matrix, backends)
    decode = DecodePhase(matrix, decode_batches, decode_steps) if "decode" in phases else None
    inj = {}
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
            config,
            dense,
            linears,
            regime=regime,
            path=getattr(ckpt, "path", None),
            tokenizer=tok,
            engine="reference",
            act_backend=act,
        )
        ops = prefill.capture(regime, model, token_lists, say)
        timings[f"{regime}_capture_s"] = _lap(t_r, device)
        t_c = time.perf_counter()
        say(f"{regime}: cells")
        prefill.cells(regime, ops, linears, ckpt.quantized_linears, advance)
        timings[f"{regime}_cells_s"] = _lap(t_c, device)
        del ops
        if decode is not None:
            t_d = time.perf_counter()
            say(f"{regime}: decode, batches {','.join(map(str, decode.batches))} x {decode.steps} steps")
            decode.run(regime, model, linears, ckpt.quantized_linears, token_lists, backends, advance)
            timings[f"{regime}_decode_s"] = _lap(t_d, device)
        if injection is not None:
            t_i = time.perf_counter()
            say(f"{regime}: faults injected into the generating model")
            inj[regime] = run_injection(model, token_lists, backends, **injection)
            timings[f"{regime}_injection_s"] = _lap(t_i, device)
        del model
        # On CUDA the next regime (pow2) is derived on the device from these tensors (audit/linears.py).
        previous = linears if cuda else None
        del linears
    layers = len(ckpt.quantized_linears)
    scorers = [prefill.scorer] + ([decode.scorer] if decode is not None else [])
    for sc in scorers:  # the end-to-end runs span the phases: a kernel fault in one explains another's
        sc.fault_in_run = any(o.kernel_faults for o in scorers)
    converted = converted_info(config)
    if converted is not None:
        converted["scales_all_power_of_two"] = prefill.native_pow2_layers == layers
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
        **prefill.result(layers),
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
    if act != "reference":
        result["activation_quantizer"] = act
    if decode is not None:
        result["decode"] = decode.result(keep_cells, native_is_pow2=prefill.native_is_pow2(layers))
    if injection is not None:
        result["injection"], result["injection_scorecard"] = score_injection(inj, injection)
    if keep_cells:
        result["cell_results"] = prefill.scorer.rows
    from requant.audit.report import verdict

    result["verdict"] = verdict(result)[1]  # the culprit named when a kernel breaks its declared order
    return result
