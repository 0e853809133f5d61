"""The decode phase and the end-to-end fault injection on the embedded default, reference pair.

Independent references: the runtime's own greedy decoding (Model.greedy) for the tokens the
capture and the injection decode; the definitions in audit/faults.py for which faults leave
the bits unchanged under power-of-two scales; the prefill-only audit (conftest.default_audit)
for the prefill keys, which the decode phase must leave exactly as they were.
"""

import json

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit.compare import summarize_layers
from requant.audit.decode import batch_prompts, decode_operands
from requant.audit.injection import INJECTOR, run_injection, score_injection
from requant.audit.matrix import PINS, load_matrix, matrix_path
from requant.audit.suite import run_audit
from requant.backends import REFERENCE_PAIR
from requant.checkpoint import open_checkpoint
from requant.models.prompts import prompts
from requant.runtime import load_model

PREFILL_KEYS = ("per_layer", "per_layer_summary", "cells", "scorecard", "detection", "baseline", "end_to_end")


def _tokens(model, n):
    return [model.tokenizer.encode(t) for t in prompts(n)]


def test_decode_phase_audits_each_step_at_its_batch_size(default_audit):
    res = run_audit(
        open_checkpoint(DEFAULT_CHECKPOINT),
        REFERENCE_PAIR,
        3,
        "cpu",
        phases=("prefill", "decode"),
        decode_batches=(1, 3),
        decode_steps=1,
    )
    for k in PREFILL_KEYS:  # the prefill record is the prefill-only audit's, key by key
        assert res[k] == default_audit[k], k
    dec = res["decode"]
    layers = res["layers"]
    assert dec["batches"] == [1, 3] and dec["steps"] == 1
    assert dec["cells"] == layers * 21 * 2 * 2  # 21 variants x 2 regimes x 2 batch sizes x 1 step
    assert len(dec["per_layer"]) == layers * 2 * 2
    assert all(r["m"] == r["batch"] for r in dec["per_layer"])  # never concatenated: M = the batch
    card = dec["scorecard"]
    assert card["matrix_pinned"] and card["false_positives"] == 0 and card["false_negatives"] == 0
    s = dec["per_layer_summary"]
    assert s["pow2"]["bitwise_equal"] == s["pow2"]["layers"] == layers * 2
    assert set(s["by_batch"]) == {"1", "3"}
    assert dec["end_to_end"]["pow2"]["3"]["bitwise_equal"] and dec["end_to_end"]["pow2"]["3"]["outcome"] == "silent"
    from requant.audit.report import markdown

    md = markdown(res)
    pre = res["per_layer_summary"]["pow2"]
    assert "## Decode beside prefill" in md
    assert f"| prefill | M = {res['tokens']} (packed) | {pre['bitwise_equal']}/{pre['layers']} |" in md
    assert f"| decode | M = 3, 1 steps | {layers}/{layers} |" in md


def test_decode_capture_decodes_the_greedy_tokens():
    model = load_model(DEFAULT_CHECKPOINT, engine="reference")
    toks = batch_prompts(_tokens(model, 2), 3)  # cycled: prompt 0 twice
    ops, fed, _ = decode_operands(model, toks, 3)
    want = model.greedy(toks, 3)  # independent: the runtime's own greedy loop
    assert torch.stack(fed, 1).tolist() == [w[:3] for w in want]
    q = ops[1]["model.layers.0.self_attn.q_proj"]
    assert q is ops[1]["model.layers.0.self_attn.v_proj"] and q.a.shape == (3, model.arch.hidden)
    assert torch.equal(q.a[0], q.a[2]) and torch.equal(q.s_a[0], q.s_a[2])  # same prompt, same row bits


def test_injection_scored_on_both_regimes(tmp_path):
    runs = {}
    for regime in ("native", "pow2"):
        model = load_model(DEFAULT_CHECKPOINT, regime=regime, engine="reference")
        toks = _tokens(model, 2)
        runs[regime] = run_injection(model, toks, REFERENCE_PAIR, tokens=2)
        assert runs[regime]["reference_tokens"] == model.greedy(toks, 2)  # the unfaulted run is the greedy run
    assert INJECTOR not in kernels.scaled_mm_backends()  # unregistered afterwards
    table, card = score_injection(runs)
    assert card["matrix_version"] == 4 and card["matrix_pinned"] and card["matrix_sha256"] == PINS[4]
    assert card["scored"] == 16 and card["false_positives"] == 0 and card["false_negatives"] == 0, card
    for regime in ("native", "pow2"):
        for scope in ("all", "one_layer"):
            f8, f7 = (table[f][regime] if scope == "all" else table[f][regime][scope] for f in ("F8", "F7"))
            assert f8["logits_bitwise_equal"] and f8["c7_flagged"] == 0
            assert f7["changed_prompts"] >= 1 and f7["c7"] == "fire"
    for f in ("F1", "F2", "F3", "F5"):  # exact under power-of-two scales (audit/faults.py)
        assert table[f]["pow2"]["logits_bitwise_equal"] and table[f]["pow2"]["one_layer"]["logits_bitwise_equal"]
    assert not table["F4"]["pow2"]["logits_bitwise_equal"]  # truncation is not hidden by pow2 scales
    assert len(runs["pow2"]["one_layer"]) == 7
    from requant.audit.report_phases import injection_markdown, plot_injection

    result = {"injection": table, "injection_scorecard": card}
    md = "\n".join(injection_markdown(result))
    f7 = table["F7"]["pow2"]
    assert f"| F7 | pow2 | {f7['changed_prompts']}/2 |" in md and "16 scored verdicts" in md
    assert plot_injection(result, tmp_path / "i.png").read_bytes()[:4] == b"\x89PNG"
    assert all(n.startswith("model.layers.3.") for n in runs["pow2"]["one_layer"])


def test_matrix_v3_repeats_v2_and_predicts_the_injection():
    v2, v3 = load_matrix(matrix_path("v2")), load_matrix(matrix_path("v3"))
    assert v3.pinned and v3.cells == v2.cells and v3.end_to_end == v2.end_to_end
    assert v3.injection[("C7", "F8", "native", "one_layer")] == "silent"
    assert ("C7", "F4", "pow2", "all") not in v3.injection  # no claim


def test_power_of_two_native_scales_are_said_so():
    rows = [
        {"regime": r, "bitwise_equal": True, "mismatches": 0, "elements": 4, "max_ulp": 0} for r in ("native", "pow2")
    ]
    assert summarize_layers(rows)["line"] == "pow2: 1/1 layers bitwise equal; native: 1/1"
    line = summarize_layers(rows, native_is_pow2=True)["line"]
    assert line == "pow2: 1/1 layers bitwise equal; native scales are already powers of two: native = pow2"


def test_register_scaled_mm():
    from tests.audit.custom_kernels import triton_order

    try:
        kernels.register_scaled_mm("test-kernel", triton_order, order="triton-order")
        assert "test-kernel" in kernels.scaled_mm_backends()
        assert kernels.EMULATION_OF["test-kernel"] == "reference-triton-order"
        a = torch.ones(2, 3, dtype=torch.int8)
        s = torch.ones(2, 1)
        assert torch.equal(kernels.scaled_mm(a, a, s, s, backend="test-kernel"), triton_order(a, a, s, s))
    finally:
        kernels.unregister_scaled_mm("test-kernel")
    assert "test-kernel" not in kernels.scaled_mm_backends() and "test-kernel" not in kernels.EMULATION_OF
    try:
        kernels.register_scaled_mm("cutlass", triton_order)
    except ValueError as exc:
        assert "built-in" in str(exc)
    else:
        raise AssertionError("a built-in name was replaced")


def test_the_injector_faults_only_its_target_weights():
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.injection import FaultInjector
    from requant.kernels.reference import scaled_mm_triton_order
    from tests.audit.conftest import make_operands

    (act, w1), (_, w2) = make_operands(1, k=96), make_operands(2, k=96)
    inj = FaultInjector("reference-triton-order")
    inj.fault, inj.targets = FAULTS["F7"], {w1.w.data_ptr()}
    hit = inj(act.a, w1.w, act.s_a, w1.s_w)
    assert torch.equal(hit.view(torch.int16), FAULTS["F7"](act.a, w1.w, act.s_a, w1.s_w).view(torch.int16))
    assert not torch.equal(
        hit.view(torch.int16), scaled_mm_triton_order(act.a, w1.w, act.s_a, w1.s_w).view(torch.int16)
    )
    miss = inj(act.a, w2.w, act.s_a, w2.s_w)
    assert torch.equal(miss.view(torch.int16), scaled_mm_triton_order(act.a, w2.w, act.s_a, w2.s_w).view(torch.int16))


def test_device_fault_kernels_name_the_same_variants_as_fault_kernels():
    """audit.injection.device_faults: on CPU the kernels of audit/fault_kernels.py themselves; its
    variant table names each kernel's own variant (fault_kernels' function names are the variant
    ids)."""
    from requant.audit.fault_kernels import FAULTS
    from requant.audit.injection import _VARIANT_OF, device_faults

    assert device_faults("cpu") == FAULTS
    assert {f: fn.__name__ for f, fn in FAULTS.items()} == {f: v.replace(".", "_") for f, v in _VARIANT_OF.items()}


def test_lean_fault_kernels_give_the_fault_kernels_bits():
    """audit.injection.lean_faults (no reference output, the accumulators passed in) equals
    audit/fault_kernels.py's kernels bit for bit, on the definitions' accumulators (CPU)."""
    from requant.audit.fault_kernels import FAULTS
    from requant.audit.faults import accumulate_bf16_tiles
    from requant.audit.injection import lean_faults
    from requant.kernels.reference import accumulate
    from tests.audit.conftest import make_operands

    lean = lean_faults(accumulate, accumulate_bf16_tiles)
    for m in (1, 8, 40):
        act, wt = make_operands(m, m=m, k=160, n=48)
        ops = (act.a, wt.w, act.s_a, wt.s_w)
        for f, fn in FAULTS.items():
            assert torch.equal(lean[f](*ops).view(torch.int16), fn(*ops).view(torch.int16)), (f, m)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_fault_kernels_on_cuda_give_the_definitions_bits():
    """On CUDA the injection's kernels (cuBLASLt accumulator, Triton F6) equal audit/fault_kernels.py's
    (float64 accumulator, F6's torch tile loop) bit for bit, at decode and prefill sizes."""
    from requant.audit.fault_kernels import FAULTS
    from requant.audit.injection import device_faults
    from tests.audit.conftest import make_operands

    fast = device_faults("cuda")
    for m in (1, 8, 40):
        act, wt = make_operands(m, m=m, k=512, n=256)
        ops = (act.a.cuda(), wt.w.cuda(), act.s_a.cuda(), wt.s_w.cuda())
        for f, fn in FAULTS.items():
            assert torch.equal(fast[f](*ops).view(torch.int16), fn(*ops).view(torch.int16)), (f, m)


def test_matrix_v4_is_v3_but_the_f9c_claim():
    v3, v4 = load_matrix(matrix_path("v3")), load_matrix(matrix_path("v4"))
    assert v4.pinned and v4.version == 4 and v3.pinned
    assert v4.cells == v3.cells and v4.end_to_end == v3.end_to_end
    moved = {("C7", "F9c", r, "all") for r in ("native", "pow2")}
    assert {k: v for k, v in v3.injection.items() if k not in moved} == v4.injection
    assert all(v3.injection[k] == "fire" for k in moved)


def test_injection_one_prompt_one_token_is_scored_without_false_negatives(tmp_path):
    """The run that contradicted v3: 1 prompt, 1 greedy token. F9c moves the logits by less than
    that one token's top-1 margin (margin and deviation computed here from the run's own logits),
    so C7 is silent there: v3's 'fire' was a claim about the run, which v4 no longer makes."""
    from typer.testing import CliRunner

    from requant.audit.checks import token_risk
    from requant.audit.fault_kernels import FAULTS
    from requant.audit.injection import INJECTOR, FaultInjector, base_backend
    from requant.cli import app

    out = tmp_path / "a.json"
    args = ["audit", "--prompts", "1", "--phases", "prefill", "--injection", "--injection-tokens", "1", "--json", out]
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    card = json.loads(out.read_text())["injection_scorecard"]
    assert card["matrix_version"] == 4 and card["false_negatives"] == 0 and card["false_positives"] == 0
    # the reference for C7's silence: F9c's logits against the unfaulted ones at the one token
    model = load_model(DEFAULT_CHECKPOINT, regime="native", engine="reference")
    toks = _tokens(model, 1)
    injector = FaultInjector(base_backend(REFERENCE_PAIR))
    kernels.register_scaled_mm(INJECTOR, injector, order="triton-order")
    try:
        m = model.with_backends(INJECTOR, engine="reference")
        ref = m.logits(toks)[0][-1:]
        injector.fault, injector.targets = FAULTS["F9c"], {m.linears[n][0].data_ptr() for n in m.linears}
        bad = m.logits(toks)[0][-1:]
    finally:
        kernels.unregister_scaled_mm(INJECTOR)
    top2 = torch.topk(ref.double(), 2).values[0]
    deviation = float((ref.double() - bad.double()).abs().max())
    assert 0 < deviation < float(top2[0] - top2[1])  # the logits moved, by less than the margin
    assert token_risk(ref, bad)["flagged"] == 0
