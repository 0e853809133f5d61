"""Scoring check verdicts against the pinned prediction matrix.

A cell is one (layer, fault variant, regime). It is *observable* when the run under test
returned output bits different from the reference run; unobservable cells leave the
detection denominators. Against the matrix:
  * false positive: a check fires where the matrix says silent or predicted_miss
    (scored on every cell: a check has no business firing on an unchanged pipeline);
  * false negative: a check is silent where the matrix says fire, on an observable cell
    (an unobservable cell gives a detector nothing to detect);
  * applicability mismatch: the check's applicability differs from the matrix (counted
    apart; it is a claim about the checkpoint, e.g. native scales that are already powers
    of two, not about detection).
Baseline rows (a real backend as the kernel under test, no fault) are scored the same way
but reported beside, not inside, the detection table, one row per backend (two backends that
declare one order keep two rows). A baseline cell whose kernel is proven faulty (its output
differs from its declared order emulated on its own operands, C8; or C1 or C4 fire) is a kernel
fault, not scored against the matrix: the matrix predicts what the checks do on a kernel that
implements its declared order. Kernel faults are grouped per (backend, regime, M) with the first
differing element (kernel_faults); a check firing on a kernel that matches its declared order
stays a false positive.

The detection table counts, per fault variant and regime, observable cells and cells in
which at least one applicable check fired, and by which check. The ULP histogram bins
the bf16 distance of every changed output element by powers of two: [1], [2,3], [4,7], ...
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from requant.audit.catalogue.checks import FIRE, NOT_APPLICABLE, SILENT
from requant.audit.catalogue.matrix import PREDICTED_MISS, Matrix
from requant.audit.f6_tiles import c6_expected
from requant.regime import REGIMES

HIST_BINS = 33  # floor(log2(d)) for d in 1 .. 2**32


def bin_label(b: int) -> str:
    lo, hi = 2**b, 2 ** (b + 1) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


def ulp_histogram(dist: torch.Tensor) -> list[int]:
    """Counts of changed elements per power-of-two bin of their ULP distance (int64 input)."""
    d = dist[dist > 0]
    if d.numel() == 0:
        return [0] * HIST_BINS
    _, e = torch.frexp(d.to(torch.float64))  # d = m * 2**e, m in [0.5, 1): floor(log2 d) = e - 1
    b = (e - 1).clamp(0, HIST_BINS - 1).to(torch.int64)
    return torch.bincount(b, minlength=HIST_BINS).cpu().tolist()


@dataclass
class CellResult:
    layer: str
    regime: str
    variant: str
    family: str
    severity: str
    observable: bool
    mismatches: int
    max_ulp: int
    outcomes: dict  # check id -> fire | silent | not_applicable
    hist: list  # ulp_histogram of the changed elements
    backend: str | None = None  # a baseline cell's backend (two backends may declare one order)
    fault: dict | None = None  # a baseline cell's proven kernel fault (kernel_fault), else None
    shape: tuple | None = None  # (M, K, N): F6's C6 prediction depends on it (f6_tiles.c6_expected); not in the row

    def as_row(self) -> dict:
        row = {
            "layer": self.layer,
            "regime": self.regime,
            "variant": self.variant,
            "observable": self.observable,
            "mismatches": self.mismatches,
            "max_ulp": self.max_ulp,
            "outcomes": dict(self.outcomes),
        }
        if self.backend is not None:
            row["backend"] = self.backend
        if self.fault is not None:
            row["kernel_fault"] = dict(self.fault)
        return row


# The checks whose firing on a baseline row proves the kernel faulty, whatever the scales: C8 (its
# output is not its declared order on its own operands), C1 (it consumed other operands), C4 (its
# accumulator is not the exact one). C5/C6 compare with the reference, which a legal order may differ from.
PROVING_CHECKS = ("C1", "C4", "C8")


def bits_hex(v: int) -> str:
    """A bf16 element's bits as the reports write them (0x3f80)."""
    return f"0x{v & 0xFFFF:04x}"


def kernel_fault(outcomes: dict, m: int, elements: int, first: tuple[int, int, int, int] | None) -> dict | None:
    """A baseline cell's kernel-fault evidence, or None when nothing proves a fault. elements: output
    elements that differ from the declared order emulated on the run's own operands (C8's
    comparison, counted whether or not the matrix runs C8); first: (row, column, got bits, want bits)
    of the first of them in row-major order."""
    proven = [c for c in PROVING_CHECKS if outcomes.get(c) == FIRE and c != "C8"]
    if elements:
        proven = sorted(proven + ["C8"])
    if not proven:
        return None
    return {
        "m": m,
        "checks": proven,
        "elements": elements,
        "first": None
        if first is None
        else {"index": [first[0], first[1]], "got": bits_hex(first[2]), "want": bits_hex(first[3])},
    }


class Scorer:
    """Accumulates cell results; `summary()` gives the scorecard, detection table, histograms."""

    def __init__(self, matrix: Matrix):
        self.matrix = matrix
        self.checks = matrix.checks  # the checks the matrix predicts (v1: C1..C7, v2: + C8)
        self.layer_checks = matrix.layer_checks
        self.fp = 0
        self.fn = 0
        self.e2e_fp_fn = [0, 0]  # the end-to-end part of fp, fn (a kernel fault explains them: summary)
        self.fault_in_run = False  # a kernel fault proven in another phase of the run (set by the suite)
        self.applicability_mismatches = 0
        self.contradictions: dict = defaultdict(lambda: {"count": 0, "example_layers": []})
        self.detection: dict = {}
        self.baselines: dict = {}
        self.hist: dict = defaultdict(lambda: [0] * HIST_BINS)
        self.max_ulp: dict = defaultdict(int)
        self.cells = 0
        self.baseline_cells = 0
        self.kernel_faults: dict = {}  # (backend, regime, m) -> group (kernel_faults in summary)
        self._cells: list[CellResult] = []
        self._judged: dict = {}  # _score's key -> _judge's verdict

    def _contradict(self, kind: str, check: str, cell: CellResult, expected: str, got: str) -> None:
        c = self.contradictions[(kind, check, cell.variant, cell.regime, expected, got)]
        c["count"] += 1
        if len(c["example_layers"]) < 5:
            c["example_layers"].append(cell.layer)

    def add_end_to_end(self, check: str, regime: str, got: str, observable: bool) -> str | None:
        """Score one end-to-end verdict (C7 on the model's logits) against the matrix's
        end_to_end entries, with the same FP/FN/applicability rules as the layer cells.
        Returns the expected outcome, or None where the matrix makes no claim."""
        expected = self.matrix.end_to_end.get((check, regime))
        if expected is None:
            return None
        cell = CellResult("end-to-end", regime, "E2E", "E2E", "all", observable, 0, 0, {check: got}, [])
        if (got == NOT_APPLICABLE) != (expected == NOT_APPLICABLE):
            self.applicability_mismatches += 1
            self._contradict("applicability", check, cell, expected, got)
        elif got == FIRE and expected in (SILENT, PREDICTED_MISS):
            self.fp += 1
            self.e2e_fp_fn[0] += 1
            self._contradict("false_positive", check, cell, expected, got)
        elif got == SILENT and expected == FIRE and observable:
            self.fn += 1
            self.e2e_fp_fn[1] += 1
            self._contradict("false_negative", check, cell, expected, got)
        return expected

    def _score(self, cell: CellResult) -> tuple[int, int]:
        """Score one cell against the matrix. A cell's score depends only on its variant, regime,
        family, observability, outcomes and (F6's C6) shape: it is worked out once per distinct
        key (_judge) and replayed, the contradictions' counts and example layers as one by one."""
        key = (
            cell.variant,
            cell.regime,
            cell.family,
            cell.observable,
            tuple(map(cell.outcomes.get, self.checks)),  # a missing check (None) judges as not_applicable
            cell.shape if cell.family == "F6" else None,
        )
        verdict = self._judged.get(key)
        if verdict is None:
            verdict = self._judged[key] = self._judge(cell)
        fp, fn, found = verdict
        for kind, cid, exp, got in found:
            if kind == "applicability":
                self.applicability_mismatches += 1
            self._contradict(kind, cid, cell, exp, got)
        self.fp += fp
        self.fn += fn
        return fp, fn

    def _judge(self, cell: CellResult) -> tuple[int, int, tuple]:
        """(false positives, false negatives, contradictions as (kind, check, expected, got)) of one cell."""
        fp = fn = 0
        found = []
        for cid in self.checks:
            got = cell.outcomes.get(cid, NOT_APPLICABLE)
            exp = self.matrix.expected(cid, cell.variant, cell.regime)
            if cid == "C6" and cell.family == "F6" and cell.shape is not None:
                exp = c6_expected(cell.shape, exp)  # narrow Linears: audit/f6_tiles.py
                if exp is None:
                    continue
            if (got == NOT_APPLICABLE) != (exp == NOT_APPLICABLE):
                found.append(("applicability", cid, exp, got))
                continue
            if got == FIRE and exp in (SILENT, PREDICTED_MISS):
                fp += 1
                found.append(("false_positive", cid, exp, got))
            elif got == SILENT and exp == FIRE and cell.observable:
                fn += 1
                found.append(("false_negative", cid, exp, got))
        return fp, fn, tuple(found)

    def _kernel_fault(self, cell: CellResult) -> None:
        f = cell.fault
        g = self.kernel_faults.setdefault(
            (cell.backend, cell.regime, f["m"]),
            {
                "backend": cell.backend,
                "variant": cell.variant,
                "regime": cell.regime,
                "m": f["m"],
                "layers": 0,
                "elements": 0,
                "checks": [],
                "first": None,
            },
        )
        g["layers"] += 1
        g["elements"] += f["elements"]
        g["checks"] = sorted(set(g["checks"]) | set(f["checks"]))
        if g["first"] is None and f["first"] is not None:
            g["first"] = {"layer": cell.layer, **f["first"]}

    @property
    def rows(self) -> list[dict]:
        """Every cell added, as its JSON row (CellResult.as_row), in the order added."""
        return [cell.as_row() for cell in self._cells]

    def add(self, cell: CellResult) -> None:
        if cell.family == "B" and cell.fault is not None:
            self._kernel_fault(cell)  # a faulty kernel is outside the matrix's premise: not scored
        else:
            self._score(cell)
        self._cells.append(cell)  # rows on demand: decode's are read only with keep_cells="all"
        if cell.family == "B":
            self.baseline_cells += 1
            key = (cell.backend, cell.variant, cell.regime)
            row = self.baselines.get(key)
            if row is None:
                row = self.baselines[key] = {
                    "backend": cell.backend,
                    "variant": cell.variant,
                    "regime": cell.regime,
                    "cells": 0,
                    "differing_cells": 0,
                    "kernel_fault_cells": 0,
                    "max_ulp": 0,
                    "outcomes": {cid: {FIRE: 0, SILENT: 0, NOT_APPLICABLE: 0} for cid in self.layer_checks},
                }
            row["cells"] += 1
            row["differing_cells"] += int(cell.observable)
            row["kernel_fault_cells"] += int(cell.fault is not None)
            row["max_ulp"] = max(row["max_ulp"], cell.max_ulp)
            for cid in self.layer_checks:
                row["outcomes"][cid][cell.outcomes[cid]] += 1
            return
        self.cells += 1
        key = (cell.variant, cell.regime)
        row = self.detection.get(key)
        if row is None:
            row = self.detection[key] = {
                "fault": cell.family,
                "severity": cell.severity,
                "variant": cell.variant,
                "regime": cell.regime,
                "cells": 0,
                "observable": 0,
                "detected": 0,
                "by_check": {cid: 0 for cid in self.layer_checks},
                "max_ulp": 0,
                "predicted_detected": any(
                    self.matrix.expected(cid, cell.variant, cell.regime) == FIRE for cid in self.layer_checks
                ),
            }
        row["cells"] += 1
        if cell.max_ulp > row["max_ulp"]:
            row["max_ulp"] = cell.max_ulp
        if cell.max_ulp > self.max_ulp[cell.family]:
            self.max_ulp[cell.family] = cell.max_ulp
        if cell.hist:
            h = self.hist[(cell.family, cell.regime)]
            for i, v in enumerate(cell.hist):
                h[i] += v
        if cell.observable:
            row["observable"] += 1
            fired = [cid for cid in self.layer_checks if cell.outcomes[cid] == FIRE]
            row["detected"] += int(bool(fired))
            for cid in fired:
                row["by_check"][cid] += 1

    def summary(self) -> dict:
        families = sorted({r["fault"] for r in self.detection.values()})
        hist = {}
        for fam in families:
            hist[fam] = {}
            for regime in REGIMES:
                counts = self.hist.get((fam, regime), [0] * HIST_BINS)
                hist[fam][regime] = {bin_label(i): c for i, c in enumerate(counts) if c}
        contradictions = [
            {"kind": k[0], "check": k[1], "variant": k[2], "regime": k[3], "expected": k[4], "got": k[5], **v}
            for k, v in sorted(self.contradictions.items())
        ]
        fp, fn = self.fp, self.fn
        if self.kernel_faults or self.fault_in_run:
            # The end-to-end verdicts compare the pair's logits (decode's include the prefill into
            # the cache); with a kernel of the pair proven faulty in any phase they are its
            # consequence, outside the matrix's premise (both kernels legal).
            fp, fn = fp - self.e2e_fp_fn[0], fn - self.e2e_fp_fn[1]
            for c in contradictions:
                if c["variant"] == "E2E" and c["kind"] in ("false_positive", "false_negative"):
                    c["kind"] = "after_kernel_fault"
        return {
            "scorecard": {
                "false_positives": fp,
                "false_negatives": fn,
                "applicability_mismatches": self.applicability_mismatches,
                "matrix_sha256": self.matrix.sha256,
                "matrix_version": self.matrix.version,
                "matrix_pinned": self.matrix.pinned,
                "kernel_faults": sum(g["layers"] for g in self.kernel_faults.values()),
                "contradictions": contradictions,
            },
            "detection": list(self.detection.values()),
            "baseline": list(self.baselines.values()),
            "kernel_faults": list(self.kernel_faults.values()),
            "max_ulp_by_fault": {fam: self.max_ulp[fam] for fam in families},
            "ulp_histograms": hist,
        }
