"""audit/catalogue/scoring.py: the false positive / negative rules on hand-made cells, and the
power-of-two ULP bins (reference: integer bit_length)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 400))
def test_scorecard_equals_the_rules_applied_cell_by_cell(seed, n):
    """Scorer judges each distinct (variant, regime, family, observability, outcomes, F6 shape) once
    and replays it; its scorecard against the module docstring's rules restated here and applied to
    every cell on its own (counts, every contradiction with its first five layers in order), over
    drawn streams of cells that repeat keys, every outcome on every check, F6 shapes
    with one, two or many tiles (C6 refined or no claim) and layer names in order."""
    from requant.audit.f6_tiles import c6_expected

    g = torch.Generator().manual_seed(seed)
    m = load_matrix()
    variants = sorted({v for (_, v, _) in m.cells if v != "E2E" and not v.startswith("B")})
    choice = lambda seq: seq[int(torch.randint(0, len(seq), (1,), generator=g))]  # noqa: E731
    shapes = [(1, 64, 8), (8, 128, 2048), (240, 2048, 768), (1, 768, 2048), (3, 65, 100)]
    s = Scorer(m)
    fp = fn = appl = 0
    found: dict = {}
    for i in range(n):
        variant, regime = choice(variants[: 1 + seed % len(variants)]), choice(("native", "pow2"))
        outcomes = {c: choice((FIRE, SILENT, NOT_APPLICABLE)) for c in m.checks}
        observable = bool(torch.rand(1, generator=g) < 0.6)
        c = CellResult(f"L{i}", regime, variant, variant.split(".")[0], variant.split(".")[1], observable,
                       int(observable), int(observable), outcomes, [], shape=choice(shapes))  # fmt: skip
        s.add(c)
        for cid in m.checks:  # the rules, cell by cell
            got, exp = outcomes.get(cid, NOT_APPLICABLE), m.expected(cid, variant, regime)
            if cid == "C6" and c.family == "F6":
                exp = c6_expected(c.shape, exp)
                if exp is None:
                    continue
            kind = None
            if (got == NOT_APPLICABLE) != (exp == NOT_APPLICABLE):
                kind, appl = "applicability", appl + 1
            elif got == FIRE and exp in (SILENT, "predicted_miss"):
                kind, fp = "false_positive", fp + 1
            elif got == SILENT and exp == FIRE and observable:
                kind, fn = "false_negative", fn + 1
            if kind:
                e = found.setdefault((kind, cid, variant, regime, exp, got), {"count": 0, "example_layers": []})
                e["count"] += 1
                if len(e["example_layers"]) < 5:
                    e["example_layers"].append(c.layer)
    card = s.summary()["scorecard"]
    assert (card["false_positives"], card["false_negatives"], card["applicability_mismatches"]) == (fp, fn, appl)
    want = [{"kind": k[0], "check": k[1], "variant": k[2], "regime": k[3], "expected": k[4], "got": k[5], **v}
            for k, v in sorted(found.items())]  # fmt: skip
    assert card["contradictions"] == want
    assert [r["layer"] for r in s.rows] == [f"L{i}" for i in range(n)]
