"""audit/catalogue/scoring.py: the false positive / negative rules on hand-made cells, and the
power-of-two ULP bins (reference: integer bit_length)."""

import pytest
import torch

from requant.audit.catalogue.checks import FIRE, NOT_APPLICABLE, SILENT
from requant.audit.catalogue.matrix import load_matrix
from requant.audit.catalogue.scoring import CellResult, Scorer, bin_label, ulp_histogram


def cell(variant, regime, observable, **over):
    fam, sev = variant.split(".") if not variant.startswith("B.") else ("B", "none")
    m = load_matrix()
    outcomes = {
        c: ({"fire": FIRE, "not_applicable": NOT_APPLICABLE}.get(m.expected(c, variant, regime), SILENT))
        for c in ("C1", "C2", "C3", "C4", "C5", "C6", "C7")
    }
    outcomes.update(over)
    return CellResult(
        "L", regime, variant, fam, sev, observable, 1 if observable else 0, 1 if observable else 0, outcomes, [0] * 33
    )


def test_predicted_outcomes_score_zero():
    s = Scorer(load_matrix())
    s.add(cell("F6.all", "pow2", True))
    s.add(cell("F3.all", "native", True))
    s.add(cell("B.cutlass-order", "native", True))
    out = s.summary()
    assert out["scorecard"]["false_positives"] == 0 and out["scorecard"]["false_negatives"] == 0
    det = {(d["variant"], d["regime"]): d for d in out["detection"]}
    assert det[("F6.all", "pow2")]["detected"] == 1 and det[("F3.all", "native")]["detected"] == 0
    assert len(out["baseline"]) == 1 and s.cells == 2


def test_false_positive_scored_everywhere_false_negative_only_if_observable():
    s = Scorer(load_matrix())
    s.add(cell("F8.all", "pow2", False, C6=FIRE))  # null fault firing: false positive
    s.add(cell("F6.all", "native", False, C6=SILENT))  # unobservable: not a false negative
    s.add(cell("F6.all", "native", True, C6=SILENT))  # observable: false negative
    s.add(cell("F3.one", "native", True, C6=FIRE))  # predicted miss that fired: false positive
    card = s.summary()["scorecard"]
    assert card["false_positives"] == 2 and card["false_negatives"] == 1
    kinds = {(c["kind"], c["variant"]) for c in card["contradictions"]}
    assert kinds == {("false_positive", "F8.all"), ("false_negative", "F6.all"), ("false_positive", "F3.one")}


def test_applicability_mismatch_counted_apart():
    s = Scorer(load_matrix())
    s.add(cell("F4.all", "native", True, C5=SILENT))  # C5 applicable under native: pow2 native scales
    card = s.summary()["scorecard"]
    assert card["applicability_mismatches"] == 1 and card["false_positives"] == 0


@pytest.mark.parametrize("d", [1, 2, 3, 4, 7, 8, 255, 256, 2**31 - 1, 2**31])
def test_histogram_bins_are_bit_lengths(d):
    h = ulp_histogram(torch.tensor([0, d], dtype=torch.int64))
    assert sum(h) == 1 and h[d.bit_length() - 1] == 1
    lo, _, hi = bin_label(d.bit_length() - 1).partition("-")
    assert int(lo) <= d <= int(hi or lo)


def test_end_to_end_c7_is_scored_against_the_matrix():
    """The matrix's end_to_end entries: C7 x pow2 is predicted silent (scored); C7 x native
    makes no claim (reported only)."""
    s = Scorer(load_matrix())
    assert s.add_end_to_end("C7", "pow2", SILENT, observable=False) == SILENT
    assert s.add_end_to_end("C7", "native", FIRE, observable=True) is None
    assert (s.fp, s.fn, s.applicability_mismatches) == (0, 0, 0)
    assert s.add_end_to_end("C7", "pow2", FIRE, observable=True) == SILENT
    assert s.fp == 1
    rows = s.summary()["scorecard"]["contradictions"]
    assert [(r["kind"], r["check"], r["regime"], r["expected"], r["got"]) for r in rows] == [
        ("false_positive", "C7", "pow2", "silent", "fire")
    ]
    s.add_end_to_end("C7", "pow2", NOT_APPLICABLE, observable=True)
    assert s.applicability_mismatches == 1


def test_a_baseline_row_that_proves_its_kernel_faulty_is_a_kernel_fault_not_false_positives():
    """A baseline cell with kernel-fault evidence (C8's comparison) is grouped per (backend, regime,
    M), first element kept, and not scored; the same row without evidence firing C5 stays a false
    positive; a kernel fault anywhere in the run relabels the end-to-end contradictions."""
    from requant.audit.catalogue.matrix import matrix_path
    from requant.audit.catalogue.scoring import kernel_fault

    m = load_matrix(matrix_path("v2"))
    s = Scorer(m)
    bad = kernel_fault({"C8": FIRE}, 8, 3, (0, 5, 0x3F81, 0x3F80))
    for layer, fault in (("L0", None), ("L1", bad), ("L2", kernel_fault({"C8": FIRE}, 8, 2, (1, 0, 0, 0x8000)))):
        c = cell(
            "B.cutlass-order", "pow2", fault is not None, C5=FIRE if fault else SILENT, C8=FIRE if fault else SILENT
        )
        c.layer, c.backend, c.fault = layer, "k", fault
        s.add(c)
    out = s.summary()
    assert out["scorecard"]["false_positives"] == 0 and out["scorecard"]["kernel_faults"] == 2
    [g] = out["kernel_faults"]
    assert (g["backend"], g["regime"], g["m"], g["layers"], g["elements"], g["checks"]) == (
        "k",
        "pow2",
        8,
        2,
        5,
        ["C8"],
    )
    assert g["first"] == {"layer": "L1", "index": [0, 5], "got": "0x3f81", "want": "0x3f80"}
    assert [(b["backend"], b["cells"], b["kernel_fault_cells"]) for b in out["baseline"]] == [("k", 3, 2)]
    legal = Scorer(m)  # C5 firing on a kernel that matches its declared order: a false positive
    c = cell("B.cutlass-order", "pow2", True, C5=FIRE, C8=SILENT)
    c.backend = "k"
    legal.add(c)
    legal.add_end_to_end("C7", "pow2", FIRE, observable=True)
    assert legal.summary()["scorecard"]["false_positives"] == 2
    legal.fault_in_run = True  # a kernel fault proven in another phase: the end-to-end one is its consequence
    card = legal.summary()["scorecard"]
    assert card["false_positives"] == 1 and {c["kind"] for c in card["contradictions"]} == {
        "false_positive",
        "after_kernel_fault",
    }
    assert kernel_fault({"C1": FIRE, "C4": SILENT}, 1, 0, None) == {
        "m": 1,
        "checks": ["C1"],
        "elements": 0,
        "first": None,
    }
    assert kernel_fault({"C8": SILENT}, 1, 0, None) is None
