"""audit/prediction_matrix.json and its pin (audit.matrix.PINNED_SHA256)."""

import hashlib
import json

from requant.audit.checks import CHECK_IDS
from requant.audit.faults import VARIANTS
from requant.audit.matrix import (
    BASELINE_VARIANTS,
    MATRIX_PATH,
    PINNED_SHA256,
    REGIMES,
    baseline_variant,
    file_sha256,
    load_matrix,
)


def test_file_matches_the_pin():
    assert hashlib.sha256(MATRIX_PATH.read_bytes()).hexdigest() == PINNED_SHA256
    m = load_matrix()
    assert m.pinned and m.sha256 == file_sha256(MATRIX_PATH)


def test_every_check_variant_regime_has_an_entry():
    m = load_matrix()
    keys = {(c, v, r) for c in CHECK_IDS for v in [x.id for x in VARIANTS] + list(BASELINE_VARIANTS) for r in REGIMES}
    assert set(m.cells) == keys
    assert m.end_to_end == {("C7", "pow2"): "silent"}


def test_matrix_states_the_expected_structure():
    m = load_matrix()
    for r in REGIMES:
        assert all(m.expected(c, "F8.all", r) in ("silent", "not_applicable") for c in CHECK_IDS)
        for fam in ("F6", "F7"):
            assert m.expected("C3", f"{fam}.all", r) == "fire" and m.expected("C4", f"{fam}.all", r) == "fire"
        for b in BASELINE_VARIANTS:
            assert all(m.expected(c, b, r) != "fire" for c in CHECK_IDS)
    for sev in ("one", "1pct", "all"):
        assert m.expected("C5", f"F4.{sev}", "pow2") == "fire"
        for fam in ("F1", "F2", "F3", "F4", "F5"):
            assert m.expected("C6", f"{fam}.{sev}", "native") == "predicted_miss"
            assert m.expected("C5", f"{fam}.{sev}", "native") == "not_applicable"


def test_a_tampered_matrix_is_not_pinned(tmp_path):
    doc = json.loads(MATRIX_PATH.read_text())
    doc["cells"][0]["expected"] = "fire" if doc["cells"][0]["expected"] != "fire" else "silent"
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    m = load_matrix(p)
    assert not m.pinned


def test_baseline_rows_by_epilogue_order():
    assert baseline_variant("cutlass") == baseline_variant("reference-cutlass-order") == "B.cutlass-order"
    assert baseline_variant("triton") == baseline_variant("reference-triton-order") == "B.triton-order"
