"""The CI structural test of the issue: the whole catalogue, the checks, the pinned matrix
and the scoring on the embedded default with the reference backends
(reference-cutlass-order vs reference-triton-order, kernels/reference.py), asserting the
structure theory predicts."""

from requant.audit.catalogue.faults import VARIANTS
from requant.audit.catalogue.matrix import PINNED_SHA256


def test_scorecard_is_clean(default_audit):
    card = default_audit["scorecard"]
    assert card["matrix_sha256"] == PINNED_SHA256 and card["matrix_pinned"]
    assert card["false_positives"] == 0, card["contradictions"]
    assert card["false_negatives"] == 0, card["contradictions"]
    assert card["applicability_mismatches"] == 0, card["contradictions"]


def test_cell_count(default_audit):
    assert default_audit["layers"] == 42  # the trained default: 6 layers x 7 Linears
    assert (
        default_audit["cells"]
        == 42 * 21 * 2
        == len([r for r in default_audit["cell_results"] if not r["variant"].startswith("B.")])
    )
    assert len(default_audit["detection"]) == 42


def det(result, fam=None, regime=None):
    return [
        d
        for d in result["detection"]
        if (fam is None or d["fault"] == fam) and (regime is None or d["regime"] == regime)
    ]


def test_null_fault_never_fires(default_audit):
    rows = [r for r in default_audit["cell_results"] if r["variant"] == "F8.all"]
    assert len(rows) == 84
    assert all(o != "fire" for r in rows for o in r["outcomes"].values())
    assert all(not r["observable"] for r in rows)


def test_precondition_faults_detected_in_every_observable_cell(default_audit):
    for fam in ("F6", "F7"):
        for d in det(default_audit, fam):
            assert d["observable"] == d["cells"] == 42
            assert d["detected"] == d["observable"] == d["by_check"]["C3"] == d["by_check"]["C4"] == d["by_check"]["C6"]


def test_truncation_detected_only_under_pow2(default_audit):
    for d in det(default_audit, "F4"):
        assert d["observable"] > 0
        if d["regime"] == "pow2":
            assert d["detected"] == d["observable"] == d["by_check"]["C5"]
        else:
            assert d["detected"] == 0


def test_epilogue_faults_move_at_most_one_spacing_and_commute(default_audit):
    for fam in ("F1", "F2", "F3", "F4", "F5"):
        assert default_audit["max_ulp_by_fault"][fam] == 1
        assert set(default_audit["ulp_histograms"][fam]["native"]) <= {"1"}
    for fam in ("F1", "F2", "F3", "F5"):
        for d in det(default_audit, fam, "pow2"):
            assert d["observable"] == 0  # commutation: the faulty pipeline gives the reference bits
        for d in det(default_audit, fam, "native"):
            assert d["detected"] == 0  # one spacing: below the tolerance, and C5 does not apply


def test_operand_faults_are_detected_and_large(default_audit):
    for d in det(default_audit, "F9"):
        assert d["detected"] == d["observable"] == 42
        assert d["by_check"]["C1"] == 42
        assert d["by_check"]["C4"] == (0 if d["severity"] == "one" else 42)
    assert default_audit["max_ulp_by_fault"]["F9"] > 16 and default_audit["max_ulp_by_fault"]["F6"] > 16


def test_baseline_rows(default_audit):
    rows = {(b["variant"], b["regime"]): b for b in default_audit["baseline"]}
    assert set(rows) == {(v, r) for v in ("B.cutlass-order", "B.triton-order") for r in ("native", "pow2")}
    for (v, r), b in rows.items():
        assert all(o["fire"] == 0 for o in b["outcomes"].values()), (v, r)
        assert b["outcomes"]["C4"]["not_applicable"] == 42
        assert b["outcomes"]["C5"]["not_applicable"] == (42 if r == "native" else 0)
        assert b["max_ulp"] <= 1
    assert rows[("B.triton-order", "native")]["differing_cells"] == 0
    assert rows[("B.cutlass-order", "pow2")]["differing_cells"] == 0


def test_per_layer_pair_comparison(default_audit):
    s = default_audit["per_layer_summary"]
    assert s["pow2"]["bitwise_equal"] == s["pow2"]["layers"] == 42
    assert s["native"]["max_ulp"] <= 1
    rows = default_audit["per_layer"]
    assert len(rows) == 84 and set(rows[0]) >= {"name", "regime", "bitwise_equal", "mismatches", "max_ulp"}
    assert default_audit["end_to_end"]["pow2"]["bitwise_equal"] and default_audit["end_to_end"]["pow2"]["flagged"] == 0


def test_json_keys(default_audit):
    assert set(default_audit) >= {"cells", "layers", "per_layer", "scorecard", "detection", "max_ulp_by_fault"}
    for d in default_audit["detection"]:
        assert d["fault"] in {f"F{i}" for i in range(1, 10)} and d["regime"] in ("native", "pow2")
        assert set(d) >= {"fault", "severity", "regime", "observable", "detected", "by_check"}
    assert sorted(default_audit["max_ulp_by_fault"]) == [f"F{i}" for i in range(1, 10)]
    assert {v.id for v in VARIANTS} == {d["variant"] for d in default_audit["detection"]}
