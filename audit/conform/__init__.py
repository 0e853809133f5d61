"""Fingerprint a W8A8 kernel: which formula of audit/conform/formulas.py it implements, whether it
accumulates exactly, whether it is batch-invariant; one verdict line and a JSON record.

  __init__       fingerprint one kernel on the vectors and give the verdict
  formulas       the epilogue formulas and accumulator models it tells apart
  vectors        the crafted cases on which they differ
  fault_kernels  every catalogue fault as a scaled_mm kernel, for `--kernel`

The method and its errors: docs/conformance.md#requant-conform.
"""

from __future__ import annotations

import importlib

import torch

from requant import kernels
from requant.audit.conform.formulas import (
    ACC_MODELS,
    ACC_TITLES,
    FORMULA_TITLES,
    FORMULAS,
    LEGAL_ORDERS,
    apply_formula,
    model_accumulator,
)
from requant.audit.conform.vectors import VectorSet
from requant.kernels import emulation_of
from requant.user_kernel import KernelError, call, check_output, message

__all__ = ["KernelError", "resolve_kernel", "run_cases", "fingerprint", "declared_order"]


def declared_order(backend: str) -> str | None:
    """The order a backend declares (kernels.emulation_of), as a formula name."""

    emu = emulation_of(backend)
    if emu is None:
        return "exact" if backend == "reference" else None
    return emu.removeprefix("reference-")


def resolve_kernel(backend: str | None, kernel: str | None):
    """(name, callable) from --backend NAME or --kernel MODULE:FUNCTION (ValueError otherwise)."""
    if (backend is None) == (kernel is None):
        raise ValueError("give exactly one of --backend NAME or --kernel MODULE:FUNCTION")
    if backend is not None:
        if backend not in kernels.scaled_mm_backends():
            raise ValueError(f"unknown backend {backend!r}; known: {', '.join(kernels.scaled_mm_backends())}")
        return backend, lambda a, w, s_a, s_w: kernels.scaled_mm(a, w, s_a, s_w, backend=backend)
    module, sep, attr = kernel.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--kernel takes MODULE:FUNCTION, got {kernel!r}")
    try:
        mod = importlib.import_module(module)
    except SystemExit as exc:  # never a verdict: a module that exits on import is not a kernel
        raise ValueError(f"--kernel {kernel}: importing {module} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # any import failure of user code is a refused request
        raise ValueError(f"--kernel {kernel}: cannot import {module}: {type(exc).__name__}: {message(exc)}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"--kernel {kernel}: {module} has no callable {attr!r}")
    return kernel, fn


def _call(name: str, fn, case, device: str) -> torch.Tensor:
    ops = [t.to(device, copy=True) for t in (case.a, case.w, case.s_a, case.s_w)]  # the kernel may not touch ours
    where = f"case {case.name}"
    m, _, n = case.shape
    y = check_output(name, call(name, fn, tuple(ops), where), m, n, where)  # requant.user_kernel: one rule
    return y.detach().to("cpu").contiguous()


def run_cases(name: str, fn, vs: VectorSet, device: str, cases=None) -> dict:
    """The kernel's output for every case (or the named ones), on CPU."""
    out = {}
    for c in vs.cases:
        if cases is None or c.name in cases:
            out[c.name] = _call(name, fn, c, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out


def _diff(y: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16) != want.view(torch.int16)


def _first(case, y, want, mask) -> dict:
    i, j = (int(v) for v in mask.nonzero()[0])
    bits = lambda t: f"0x{int(t[i, j].view(torch.int16)) & 0xFFFF:04x}"  # noqa: E731
    return {
        "case": case.name,
        "element": [i, j],
        "got": bits(y),
        "want": bits(want),
        "got_value": float(y[i, j]),
        "want_value": float(want[i, j]),
    }


def _compare(cases, outs, expected_of) -> dict:
    mism, total, first = 0, 0, None
    for c in cases:
        y, want = outs[c.name], expected_of(c)
        d = _diff(y, want)
        k = int(d.sum())
        if k and first is None:
            first = _first(c, y, want, d)
        mism += k
        total += y.numel()
    return {"mismatches": mism, "elements": total, "first": first}


def _expected(model: str, formula: str, memo: dict):
    def of(c):
        if model == "exact":
            return c.expected[formula]
        key = (model, c.name)
        if key not in memo:
            memo[key] = model_accumulator(model, c.a, c.w)
        return apply_formula(formula, memo[key], c.s_a, c.s_w)

    return of


def _batch(vs: VectorSet, outs: dict) -> dict:
    alone = {"P0": outs.get("batch_m0001"), "P1": outs.get("batch_m0001b")}
    failures, checked = [], []
    for c in vs.by_kind("batch"):
        if c.name not in outs or c.name in ("batch_m0001", "batch_m0001b"):
            continue
        checked.append(c.shape[0])
        for probe, row in c.probes.items():
            ref = alone.get(probe)
            if ref is None:
                continue
            d = _diff(outs[c.name][row : row + 1], ref)
            if bool(d.any()):
                failures.append({"case": c.name, "m": c.shape[0], "probe": probe, "row": row, "elements": int(d.sum())})
    return {"invariant": not failures, "ms": checked, "failures": failures}


def _title(formula: str, model: str) -> str:
    t = FORMULA_TITLES[formula]
    return t if model == "exact" else f"{t} on {ACC_TITLES[model]}"


def fingerprint(name: str, outs: dict, vs: VectorSet, declared: str | None = None) -> dict:
    """Identify the kernel from its outputs (run_cases) and give the verdict."""
    ident = [c for c in vs.cases if c.kind in ("epilogue", "accumulator") and c.name in outs]
    memo: dict = {}
    candidates = {}
    for model in ACC_MODELS:
        for f in FORMULAS:
            candidates[(model, f)] = _compare(ident, outs, _expected(model, f, memo))
    order = {f: i for i, f in enumerate(FORMULAS)}
    rank = sorted(candidates, key=lambda k: (candidates[k]["mismatches"], ACC_MODELS.index(k[0]), order[k[1]]))
    matches = [k for k in rank if candidates[k]["mismatches"] == 0]
    best = rank[0]  # a match if there is one: exact accumulation first, then catalogue order (legal orders first)
    model, formula = best
    identified = bool(matches)
    # An inexact accumulator can erase the differences between formulas (a bf16 sum keeps 8 bits,
    # on which several orders round alike): then the model is known and the formula is not.
    agreeing = [f for m, f in matches if m == model]
    batch_cases = [c for c in vs.by_kind("batch") if c.name in outs]
    batch = _batch(vs, outs)
    batch["vs_formula"] = _compare(batch_cases, outs, _expected(model, formula, memo)) if batch_cases else None
    exact_acc = identified and model == "exact"
    legal = identified and len(agreeing) == 1 and formula in LEGAL_ORDERS
    declared_ok = None if declared is None else (identified and exact_acc and formula == declared)
    batch_ok = batch["invariant"] and (batch["vs_formula"] is None or batch["vs_formula"]["mismatches"] == 0)
    conforms = legal and exact_acc and batch_ok and declared_ok is not False
    if identified:
        if len(agreeing) == 1:
            parts = [
                f"implements {FORMULA_TITLES[formula]}" + ("" if formula in LEGAL_ORDERS else ": not a legal order")
            ]
        else:
            parts = [
                f"implements one of {len(agreeing)} formulas that agree on its accumulator ({', '.join(agreeing)})"
            ]
        parts.append(ACC_TITLES["exact"] if exact_acc else f"inexact accumulation ({ACC_TITLES[model]})")
    else:
        near = candidates[best]
        fd = near["first"]
        where = f"first at case {fd['case']} element {fd['element']} (got {fd['got']}, want {fd['want']})" if fd else ""
        parts = [
            f"matches no known formula; nearest: {_title(formula, model)}, {near['mismatches']} of {near['elements']} "
            f"elements differ, {where}"
        ]
    if batch["ms"]:
        if batch["invariant"]:
            parts.append("batch-invariant")
        else:
            ms = sorted({f["m"] for f in batch["failures"]})
            parts.append(
                f"NOT batch-invariant (a probe row changes at M = {', '.join(map(str, ms[:6]))}"
                f"{', ...' if len(ms) > 6 else ''})"
            )
    if batch["vs_formula"] and batch["vs_formula"]["mismatches"] and batch["invariant"] and len(agreeing) == 1:
        parts.append(f"{batch['vs_formula']['mismatches']} batch-case elements differ from that formula")
    if declared is not None and declared_ok is False:
        parts.append(f"declares {declared}")
    return {
        "kernel": name,
        "verdict": ", ".join(parts),
        "conforms": bool(conforms),
        "identified": identified,
        "formula": formula,
        "formula_title": FORMULA_TITLES[formula],
        "legal_order": legal,
        "accumulator": model,
        "exact_accumulation": exact_acc,
        "batch": batch,
        "declared": declared,
        "declared_confirmed": declared_ok,
        "formulas_agreeing": agreeing,
        "matching_candidates": [f"{m}/{f}" for m, f in matches],
        "candidates": {
            f"{m}/{f}": {"mismatches": r["mismatches"], "elements": r["elements"], "first": r["first"]}
            for (m, f), r in candidates.items()
        },
    }
