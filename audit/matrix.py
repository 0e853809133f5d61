"""The prediction matrix, pinned before measuring.

audit/prediction_matrix.json gives, for every check x variant x regime (the 21 fault
variants and the two baseline rows B.cutlass-order / B.triton-order), the outcome theory
predicts: fire, silent, not_applicable or predicted_miss, each with its reason. It was
written from the definitions in audit/faults.py and audit/checks.py before any scored run.

Its sha256 is pinned here. Every report carries the digest of the matrix it was scored
against; a run against a file whose digest is not PINNED_SHA256 says so loudly (the CLI
prints a warning and the JSON sets `matrix_pinned: false`). When measurement contradicts
the matrix, the matrix is not edited to match: the contradiction is reported as false
positives / negatives, and a new version (with a new pin) is a deliberate, reviewed change.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from requant.audit.checks import FIRE, NOT_APPLICABLE, SILENT

MATRIX_PATH = Path(__file__).with_name("prediction_matrix.json")
PINNED_SHA256 = "d1c53158c789e7f4e81842650fe8c75a57e847c4a45f553f069a4f5fb7c2fc7d"

PREDICTED_MISS = "predicted_miss"
OUTCOMES = (FIRE, SILENT, NOT_APPLICABLE, PREDICTED_MISS)
REGIMES = ("native", "pow2")
BASELINE_VARIANTS = ("B.cutlass-order", "B.triton-order")


def baseline_variant(order_backend: str) -> str:
    """Baseline row of a backend, by the epilogue order it implements (kernels.EMULATION_OF)."""
    from requant.kernels import EMULATION_OF

    emu = EMULATION_OF.get(order_backend)
    if emu == "reference-cutlass-order":
        return "B.cutlass-order"
    if emu == "reference-triton-order":
        return "B.triton-order"
    raise ValueError(f"backend {order_backend!r} implements no known epilogue order (kernels.EMULATION_OF)")


@dataclass(frozen=True)
class Matrix:
    sha256: str
    version: int
    cells: dict  # (check, variant, regime) -> expected outcome
    why: dict  # (check, variant, regime) -> reason
    end_to_end: dict  # (check, regime) -> expected outcome

    @property
    def pinned(self) -> bool:
        return self.sha256 == PINNED_SHA256

    def expected(self, check: str, variant: str, regime: str) -> str:
        try:
            return self.cells[(check, variant, regime)]
        except KeyError:
            raise KeyError(f"prediction matrix has no entry for {check} x {variant} x {regime}") from None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_matrix(path: Path | str = MATRIX_PATH) -> Matrix:
    """Parse and validate the matrix (every outcome known, no duplicate entries)."""
    path = Path(path)
    raw = path.read_bytes()
    doc = json.loads(raw)
    cells, why = {}, {}
    for row in doc["cells"]:
        key = (row["check"], row["variant"], row["regime"])
        if row["expected"] not in OUTCOMES:
            raise ValueError(f"{path}: unknown outcome {row['expected']!r} for {key}")
        if key in cells:
            raise ValueError(f"{path}: duplicate entry {key}")
        cells[key] = row["expected"]
        why[key] = row.get("why", "")
    e2e = {(r["check"], r["regime"]): r["expected"] for r in doc.get("end_to_end", [])}
    return Matrix(hashlib.sha256(raw).hexdigest(), int(doc["version"]), cells, why, e2e)
