"""The lines `requant audit` prints about its scorecard (requant/commands/audit.py), on a real audit:
the embedded default converted to power-of-two scales and audited (tests/conftest.py audited_pow2),
whose scorecard passes with applicability mismatches (native = pow2 there, so C5 applies under
native where the matrix predicts not_applicable)."""

import json

from requant.commands.audit import scorecard_line


def test_a_passing_audit_does_not_read_as_a_failure(audited_pow2):
    result = json.loads((audited_pow2 / "requant-audit.json").read_text())
    card = result["scorecard"]
    n = card["applicability_mismatches"]
    assert card["false_positives"] == card["false_negatives"] == 0 and n > 0  # the case, for real
    line = scorecard_line("cells", result["cells"], card)
    assert line.startswith(f"cells: {result['cells']}  false positives: 0  false negatives: 0  ("), line
    assert f"({n:,} checks whose applicability differs" in line and "not a fault" in line
    assert "mismatch" not in line.lower() and "fail" not in line.lower()


def test_the_scorecard_line_keeps_a_failures_counts_and_leaves_out_zero_applicability():
    card = {"false_positives": 3, "false_negatives": 1, "applicability_mismatches": 0}
    line = scorecard_line("decode cells", 7728, card)
    assert line == "decode cells: 7728  false positives: 3  false negatives: 1"
