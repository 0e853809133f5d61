"""audit/compare.py against kernels.bf16.bitwise_equal / ulp_distance on crafted outputs,
and the per-layer comparison of the reference pair (kernels.reference orders)."""

import pytest
import torch

from requant import kernels
from requant.audit.compare import compare_layer, summarize_layers
from requant.kernels.bf16 import round_fp32_to_bf16
from tests.audit.conftest import make_operands


def test_compare_layer_counts_and_distance():
    y = round_fp32_to_bf16(torch.linspace(-3, 3, 12).reshape(3, 4))
    z = y.clone()
    z.view(torch.int16)[1, 1] += 3
    z.view(torch.int16)[2, 0] += 1
    row = compare_layer("l", "native", y, z, (3, 8, 4))
    assert row["bitwise_equal"] is False and row["mismatches"] == 2 and row["max_ulp"] == 3
    assert compare_layer("l", "pow2", y, y.clone(), (3, 8, 4))["bitwise_equal"] is True
    zero = torch.zeros(1, 1, dtype=torch.bfloat16)
    neg = -zero
    r = compare_layer("z", "native", zero, neg, (1, 1, 1))
    assert r["bitwise_equal"] is False and r["mismatches"] == 1 and r["max_ulp"] == 0


def test_reference_pair_is_bitwise_equal_under_pow2():
    for seed in range(5):
        act, wt = make_operands(seed, m=64, k=256, n=128, pow2=True)
        ya = kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend="reference-cutlass-order")
        yb = kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend="reference-triton-order")
        assert compare_layer("l", "pow2", ya, yb, (64, 256, 128))["bitwise_equal"]


def test_summary_line():
    rows = [
        {"name": "a", "regime": "pow2", "bitwise_equal": True, "mismatches": 0, "max_ulp": 0, "elements": 4},
        {"name": "a", "regime": "native", "bitwise_equal": False, "mismatches": 2, "max_ulp": 1, "elements": 4},
    ]
    s = summarize_layers(rows)
    assert s["line"] == "pow2: 1/1 layers bitwise equal; native: 0/1"
    assert s["native"]["mismatches"] == 2 and s["pow2"]["max_ulp"] == 0


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (CUTLASS)")
def test_real_pair_on_random_operands_gpu():
    """cutlass vs triton through audit.cells.audit_layer on random operands on the GPU,
    scored against the pinned matrix; the reference is kernels.reference (Triton order)."""
    from requant.audit.catalogue.matrix import load_matrix
    from requant.audit.catalogue.scoring import Scorer
    from requant.audit.cells import audit_layer
    from requant.audit.records import Activations, Weights

    scorer = Scorer(load_matrix())
    for regime in ("native", "pow2"):
        act, wt = make_operands(0, m=256, k=2048, n=1024, pow2=(regime == "pow2"))
        act = Activations(act.a.cuda(), act.s_a.cuda())
        wt = Weights(wt.w.cuda(), wt.s_w.cuda())
        row = audit_layer("random", regime, act, wt, ("cutlass", "triton"), scorer)
        if regime == "pow2":
            assert row["bitwise_equal"]
        assert row["max_ulp"] <= 1
    card = scorer.summary()["scorecard"]
    assert card["false_positives"] == 0 and card["false_negatives"] == 0, card["contradictions"]


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (CUTLASS)")
def test_real_pair_audit_of_the_default_gpu():
    """The whole audit of the embedded default with the real pair on the GPU, where the runtime's
    engine "auto" would pick the fast engine: both prefills compared end to end (C7) must run the
    same engine, so under pow2 their logits are equal and the scorecard is clean (independent
    reference: the pinned prediction matrix)."""
    from requant import DEFAULT_CHECKPOINT
    from requant.audit.suite import run_audit
    from requant.checkpoint import open_checkpoint

    result = run_audit(open_checkpoint(DEFAULT_CHECKPOINT), ("cutlass", "triton"), 3, "cuda", keep_cells=False)
    card = result["scorecard"]
    assert card["false_positives"] == 0 and card["false_negatives"] == 0, card["contradictions"]
    assert result["end_to_end"]["pow2"]["bitwise_equal"]
    s = result["per_layer_summary"]["pow2"]
    assert s["bitwise_equal"] == s["layers"]


def test_power_of_two_native_scales_are_said_so():
    rows = [
        {"regime": r, "bitwise_equal": True, "mismatches": 0, "elements": 4, "max_ulp": 0} for r in ("native", "pow2")
    ]
    assert summarize_layers(rows)["line"] == "pow2: 1/1 layers bitwise equal; native: 1/1"
    line = summarize_layers(rows, native_is_pow2=True)["line"]
    assert line == "pow2: 1/1 layers bitwise equal; native scales are already powers of two: native = pow2"
