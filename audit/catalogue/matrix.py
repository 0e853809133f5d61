"""The prediction matrices, pinned before measuring.

Four versions, each pinned by its own sha256 (PINS):
  v1  audit/catalogue/prediction_matrix.json     checks C1..C7; the seed paper's limit, reproduced
  v2  audit/catalogue/prediction_matrix_v2.json  v1's cells unchanged, plus C8 (declared-order identity)
                                       on every row and the baseline row B.fused-order
  v3  audit/catalogue/prediction_matrix_v3.json  v2's cells unchanged, plus `injection`: C7 on faults
                                       injected into the generating model (audit/phases/injection.py)
  v4  audit/catalogue/prediction_matrix_v4.json  v3 unchanged but for one correction: C7 x F9c x all
                                       is no claim (v3's 'fire' was a claim about the run's
                                       margins; docs/audit.md). The injection is scored from v4
A matrix's checks are the ones its cells name (Matrix.checks); the suite runs exactly those.

Why pinned, and what a contradiction changes: docs/audit.md#prediction-matrix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from requant.audit.catalogue.checks import ALL_CHECK_IDS, FIRE, NOT_APPLICABLE, SILENT
from requant.kernels import emulation_of

MATRIX_PATH = Path(__file__).with_name("prediction_matrix.json")
MATRIX_V2_PATH = Path(__file__).with_name("prediction_matrix_v2.json")
MATRIX_V3_PATH = Path(__file__).with_name("prediction_matrix_v3.json")
MATRIX_V4_PATH = Path(__file__).with_name("prediction_matrix_v4.json")
MATRIX_PATHS = {"v1": MATRIX_PATH, "v2": MATRIX_V2_PATH, "v3": MATRIX_V3_PATH, "v4": MATRIX_V4_PATH}
INJECTION_MATRIX_PATH = MATRIX_V4_PATH  # the injection's predictions: the newest version
PINNED_SHA256 = "d1c53158c789e7f4e81842650fe8c75a57e847c4a45f553f069a4f5fb7c2fc7d"
PINNED_SHA256_V2 = "5dca0ec5b15f6426442645e00277fe5e435a89f3beeb4ed0b2f3e7090a508a95"
PINNED_SHA256_V3 = "800c4ddfa566ce32942bac1f366c0c2a651702a73a33e5c77fade4331487525a"
PINNED_SHA256_V4 = "276b1cd9d67f22835dbe6ae1a1c3c245cdabb2aa8bb3612cbff04ee2f854e300"
PINS = {1: PINNED_SHA256, 2: PINNED_SHA256_V2, 3: PINNED_SHA256_V3, 4: PINNED_SHA256_V4}

PREDICTED_MISS = "predicted_miss"
OUTCOMES = (FIRE, SILENT, NOT_APPLICABLE, PREDICTED_MISS)
BASELINE_VARIANTS = ("B.cutlass-order", "B.triton-order")
BASELINE_VARIANTS_V2 = BASELINE_VARIANTS + ("B.fused-order",)
_BASELINE_OF = {
    "reference-cutlass-order": "B.cutlass-order",
    "reference-triton-order": "B.triton-order",
    "reference-fused-order": "B.fused-order",
}


def baseline_variant(order_backend: str) -> str:
    """Baseline row of a backend, by the epilogue order it implements (kernels.emulation_of)."""

    emu = emulation_of(order_backend)
    if emu in _BASELINE_OF:
        return _BASELINE_OF[emu]
    raise ValueError(f"backend {order_backend!r} implements no known epilogue order (kernels.EMULATION_OF)")


@dataclass(frozen=True)
class Matrix:
    sha256: str
    version: int
    cells: dict  # (check, variant, regime) -> expected outcome
    why: dict  # (check, variant, regime) -> reason
    end_to_end: dict  # (check, regime) -> expected outcome
    injection: dict = field(default_factory=dict)  # (check, fault, regime, scope) -> expected (v3)

    @property
    def pin(self) -> str | None:
        """The pinned digest of this matrix's version (None for an unknown version)."""
        return PINS.get(self.version)

    @property
    def pinned(self) -> bool:
        return self.sha256 == self.pin

    @property
    def checks(self) -> tuple[str, ...]:
        """The checks the matrix predicts, in ALL_CHECK_IDS order (v1: C1..C7; v2: C1..C8)."""

        named = {c for c, _, _ in self.cells}
        return tuple(c for c in ALL_CHECK_IDS if c in named)

    @property
    def layer_checks(self) -> tuple[str, ...]:
        """The per-layer checks (C7 is end-to-end only): the detection table's columns."""
        return tuple(c for c in self.checks if c != "C7")

    def has_variant(self, variant: str) -> bool:
        return any(v == variant for _, v, _ in self.cells)

    def expected(self, check: str, variant: str, regime: str) -> str:
        try:
            return self.cells[(check, variant, regime)]
        except KeyError:
            raise KeyError(f"prediction matrix has no entry for {check} x {variant} x {regime}") from None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def matrix_path(name: str) -> Path:
    """'v1' .. 'v4' -> the file of that pinned matrix (ValueError for anything else)."""
    try:
        return MATRIX_PATHS[name]
    except KeyError:
        raise ValueError(f"--matrix takes {' or '.join(MATRIX_PATHS)}, got {name!r}") from None


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
    inj = {}
    for r in doc.get("injection", []):
        if r["expected"] not in OUTCOMES:
            raise ValueError(f"{path}: unknown outcome {r['expected']!r} for injection {r['fault']} {r['regime']}")
        inj[(r["check"], r["fault"], r["regime"], r["scope"])] = r["expected"]
    return Matrix(hashlib.sha256(raw).hexdigest(), int(doc["version"]), cells, why, e2e, inj)
