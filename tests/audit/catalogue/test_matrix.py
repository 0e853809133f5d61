"""The prediction matrices (audit/catalogue/prediction_matrix*.json) and their pins (audit.catalogue.matrix.PINS)."""

import hashlib
import json

from requant.audit.catalogue.checks import CHECK_IDS
from requant.audit.catalogue.faults import VARIANTS
from requant.audit.catalogue.matrix import (
    BASELINE_VARIANTS,
    MATRIX_PATH,
    PINNED_SHA256,
    baseline_variant,
    file_sha256,
    load_matrix,
    matrix_path,
)
from requant.regime import REGIMES


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


def test_matrix_v3_repeats_v2_and_predicts_the_injection():
    v2, v3 = load_matrix(matrix_path("v2")), load_matrix(matrix_path("v3"))
    assert v3.pinned and v3.cells == v2.cells and v3.end_to_end == v2.end_to_end
    assert v3.injection[("C7", "F8", "native", "one_layer")] == "silent"
    assert ("C7", "F4", "pow2", "all") not in v3.injection  # no claim


def test_matrix_v4_is_v3_but_the_f9c_claim():
    v3, v4 = load_matrix(matrix_path("v3")), load_matrix(matrix_path("v4"))
    assert v4.pinned and v4.version == 4 and v3.pinned
    assert v4.cells == v3.cells and v4.end_to_end == v3.end_to_end
    moved = {("C7", "F9c", r, "all") for r in ("native", "pow2")}
    assert {k: v for k, v in v3.injection.items() if k not in moved} == v4.injection
    assert all(v3.injection[k] == "fire" for k in moved)
