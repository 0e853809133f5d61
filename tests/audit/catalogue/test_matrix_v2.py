"""Prediction matrix v2 (audit/catalogue/prediction_matrix_v2.json) and check C8 (declared-order identity).

The matrix was written before any scored run; these tests score it on the embedded default
with the reference pair and with a pair that includes the fused-scale order, and check C8
against hand-made runs: its reference is the order's emulation in kernels/reference.py on the
run's own operands."""

import json

import pytest
import torch

from requant.audit.catalogue.checks import ALL_CHECK_IDS, CHECK_IDS, c8_declared_order, run_checks
from requant.audit.catalogue.faults import VARIANTS, inject
from requant.audit.catalogue.matrix import (
    BASELINE_VARIANTS_V2,
    MATRIX_PATH,
    MATRIX_V2_PATH,
    PINNED_SHA256_V2,
    file_sha256,
    load_matrix,
    matrix_path,
)
from requant.audit.records import BACKEND_KERNELS, KernelDesc, Run
from requant.kernels.reference import epilogue_cutlass_order
from requant.regime import REGIMES
from tests.audit.conftest import make_case, one_thread


def test_v2_is_pinned_and_extends_v1_unchanged():
    v1, v2 = load_matrix(MATRIX_PATH), load_matrix(MATRIX_V2_PATH)
    assert file_sha256(MATRIX_V2_PATH) == PINNED_SHA256_V2 and v2.pinned and v2.version == 2 and v1.pinned
    assert matrix_path("v1") == MATRIX_PATH and matrix_path("v2") == MATRIX_V2_PATH
    with pytest.raises(ValueError, match="--matrix takes v1 or v2 or v3 or v4"):
        matrix_path("v9")
    assert all(v2.cells[k] == e and v2.why[k] == v1.why[k] for k, e in v1.cells.items())
    assert v1.checks == CHECK_IDS and v2.checks == ALL_CHECK_IDS
    variants = [v.id for v in VARIANTS] + list(BASELINE_VARIANTS_V2)
    assert set(v2.cells) == {(c, v, r) for c in ALL_CHECK_IDS for v in variants for r in REGIMES}
    assert v2.end_to_end == v1.end_to_end


def test_a_tampered_v2_is_not_pinned(tmp_path):
    doc = json.loads(MATRIX_V2_PATH.read_text())
    doc["cells"][-1]["expected"] = "fire"
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    assert not load_matrix(p).pinned


def test_c8_predictions_follow_the_declarations():
    v2 = load_matrix(MATRIX_V2_PATH)
    for r in REGIMES:
        for v in VARIANTS:
            want = "silent" if v.family in ("F8", "F9") else "fire"
            assert v2.expected("C8", v.id, r) == want
        for b in BASELINE_VARIANTS_V2:
            assert v2.expected("C8", b, r) == "silent"


def test_c8_sees_one_flipped_bit_under_native_scales_and_reads_the_declaration():
    case = make_case(3)
    f2 = inject(
        next(v for v in VARIANTS if v.id == "F2.one"), case
    )  # one element one spacing off the declared Triton order
    assert int((f2.y.view(torch.int16) != case.ref.y.view(torch.int16)).sum()) == 1
    assert c8_declared_order(case.ref, f2, f2.kernel).fired and not run_checks(case.ref, f2)["C6"].fired
    honest = Run(
        case.act, case.wt, None, epilogue_cutlass_order(case.acc, case.act.s_a, case.wt.s_w), BACKEND_KERNELS["cutlass"]
    )
    assert c8_declared_order(case.ref, honest, honest.kernel).outcome == "silent"
    flipped = honest.y.clone()
    flipped.view(torch.int16)[0, 0] ^= 1
    bad = Run(case.act, case.wt, None, flipped, BACKEND_KERNELS["cutlass"])
    r = c8_declared_order(case.ref, bad, bad.kernel)
    assert r.fired and r.detail == "1 elements differ from the cutlass-order emulation"
    undeclared = KernelDesc("mystery", "int", 32, "something else", False)
    assert c8_declared_order(case.ref, bad, undeclared).outcome == "not_applicable"
    f9 = inject(next(v for v in VARIANTS if v.id == "F9.all"), case)  # own operands, computed correctly
    assert c8_declared_order(case.ref, f9, f9.kernel).outcome == "silent"
    assert set(run_checks(case.ref, f2)) == set(CHECK_IDS)  # the v1 default runs C1..C7 only


@pytest.fixture(scope="module")
def v2_audits():
    from requant import DEFAULT_CHECKPOINT
    from requant.audit.suite import run_audit
    from requant.backends import REFERENCE_PAIR
    from requant.checkpoint import open_checkpoint

    m = load_matrix(MATRIX_V2_PATH)
    with one_thread():
        ck = open_checkpoint(DEFAULT_CHECKPOINT)
        return {
            pair: run_audit(ck, pair, 3, "cpu", matrix=m, keep_cells=False)
            for pair in (REFERENCE_PAIR, ("reference-cutlass-order", "cublas"))
        }


def test_v2_on_the_default_scores_clean_and_detects_every_epilogue_fault(v2_audits):
    for pair, res in v2_audits.items():
        card = res["scorecard"]
        assert card["matrix_pinned"] and card["matrix_version"] == 2
        assert (card["false_positives"], card["false_negatives"], card["applicability_mismatches"]) == (0, 0, 0), pair
        det = {(d["fault"], d["severity"], d["regime"]): d for d in res["detection"]}
        for fam in ("F1", "F2", "F3", "F4", "F5"):
            for sev in ("one", "1pct", "all"):
                d = det[(fam, sev, "native")]
                assert d["detected"] == d["observable"] == d["by_check"]["C8"]
        assert sum(det[("F2", s, "native")]["observable"] for s in ("one", "1pct", "all")) > 0
        for fam in ("F6", "F7"):
            for r in REGIMES:
                d = det[(fam, "all", r)]
                assert d["by_check"]["C8"] == d["observable"] > 0
        assert all(d["by_check"]["C8"] == 0 for k, d in det.items() if k[0] in ("F8", "F9"))


def test_v2_baseline_rows_include_the_fused_order(v2_audits):
    res = v2_audits[("reference-cutlass-order", "cublas")]
    rows = {(b["variant"], b["regime"]): b for b in res["baseline"]}
    assert set(rows) == {(v, r) for v in ("B.cutlass-order", "B.fused-order") for r in REGIMES}
    for b in rows.values():
        assert b["outcomes"]["C8"]["silent"] == b["cells"] and b["outcomes"]["C8"]["fire"] == 0
    assert res["per_layer_summary"]["pow2"]["bitwise_equal"] == res["per_layer_summary"]["pow2"]["layers"]
    assert res["kernels"]["backends"]["cublas"]["declares"] == "fused-order"


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--matrix", "v9"], "--matrix takes v1 or v2 or v3 or v4, got 'v9'"),
        (
            ["--matrix", "v1", "--backends", "reference-cutlass-order,cublas"],
            "--matrix v1 has no baseline row B.fused-order",
        ),
    ],
)
def test_audit_refuses_a_matrix_it_cannot_score(args, msg):
    from typer.testing import CliRunner

    from requant.cli import app

    res = CliRunner().invoke(app, ["audit", *args])
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and msg in errors[0], res.output
