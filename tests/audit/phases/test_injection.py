"""audit/phases/injection.py: the fault kernels injected into the generating model, on the
embedded default with the reference pair, and the injector as a run's kernel (kernels.ScaledMM).

Independent references: the runtime's own greedy decoding (Model.greedy) for the tokens the
injection decodes; the definitions in audit/catalogue/faults.py for which faults leave the bits unchanged
under power-of-two scales; the fault kernels of audit/conform/fault_kernels.py for the
injector's bits.
"""

import json

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit.catalogue.matrix import PINS
from requant.audit.phases.injection import INJECTOR, run_injection, score_injection
from requant.backends import REFERENCE_PAIR
from requant.models.prompts import prompts
from requant.runtime import load_model


def _tokens(model, n):
    return [model.tokenizer.encode(t) for t in prompts(n)]


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
    for f in ("F1", "F2", "F3", "F5"):  # exact under power-of-two scales (audit/catalogue/faults.py)
        assert table[f]["pow2"]["logits_bitwise_equal"] and table[f]["pow2"]["one_layer"]["logits_bitwise_equal"]
    assert not table["F4"]["pow2"]["logits_bitwise_equal"]  # truncation is not hidden by pow2 scales
    assert len(runs["pow2"]["one_layer"]) == 7
    from requant.audit.phases.injection import injection_markdown, plot_injection

    result = {"injection": table, "injection_scorecard": card}
    md = "\n".join(injection_markdown(result))
    f7 = table["F7"]["pow2"]
    assert f"| F7 | pow2 | {f7['changed_prompts']}/2 |" in md and "16 scored verdicts" in md
    assert plot_injection(result, tmp_path / "i.png").read_bytes()[:4] == b"\x89PNG"
    assert all(n.startswith("model.layers.3.") for n in runs["pow2"]["one_layer"])


def test_the_injector_faults_only_its_target_weights():
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.injection import FaultInjector
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
    """audit.phases.injection.device_faults: on CPU the kernels of audit/conform/fault_kernels.py themselves; its
    variant table names each kernel's own variant (fault_kernels' function names are the variant
    ids)."""
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.injection import _VARIANT_OF, device_faults

    assert device_faults("cpu") == FAULTS
    assert {f: fn.__name__ for f, fn in FAULTS.items()} == {f: v.replace(".", "_") for f, v in _VARIANT_OF.items()}


def test_lean_fault_kernels_give_the_fault_kernels_bits():
    """audit.phases.injection.lean_faults (no reference output, the accumulators passed in) equals
    audit/conform/fault_kernels.py's kernels bit for bit, on the definitions' accumulators (CPU)."""
    from requant.audit.catalogue.faults import accumulate_bf16_tiles
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.injection import lean_faults
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
    """On CUDA the injection's kernels (cuBLASLt accumulator, Triton F6) equal audit/conform/fault_kernels.py's
    (float64 accumulator, F6's torch tile loop) bit for bit, at decode and prefill sizes."""
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.injection import device_faults
    from tests.audit.conftest import make_operands

    fast = device_faults("cuda")
    for m in (1, 8, 40):
        act, wt = make_operands(m, m=m, k=512, n=256)
        ops = (act.a.cuda(), wt.w.cuda(), act.s_a.cuda(), wt.s_w.cuda())
        for f, fn in FAULTS.items():
            assert torch.equal(fast[f](*ops).view(torch.int16), fn(*ops).view(torch.int16)), (f, m)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)), reason="needs an sm90 GPU"
)
def test_batched_runs_on_cuda_equal_the_runs_one_after_another(tmp_path):
    """CUDA's default (the 22 runs as one batch) against the runs one after another, cutlass,triton
    on the tiny synthetic, both regimes: every field of the result, bit for bit."""
    from requant.checkpoint.synthetic import generate

    path = generate("tiny", tmp_path / "tiny")
    for regime in ("native", "pow2"):
        model = load_model(path, regime=regime, engine="reference", device="cuda")
        toks = _tokens(model, 4)
        one_by_one = run_injection(model, toks, ("cutlass", "triton"), tokens=6, batched=False)
        assert run_injection(model, toks, ("cutlass", "triton"), tokens=6) == one_by_one


def test_injection_one_prompt_one_token_is_scored_without_false_negatives(tmp_path):
    """The run that contradicted v3: 1 prompt, 1 greedy token. F9c moves the logits by less than
    that one token's top-1 margin (margin and deviation computed here from the run's own logits),
    so C7 is silent there: v3's 'fire' was a claim about the run, which v4 no longer makes."""
    from typer.testing import CliRunner

    from requant.audit.catalogue.checks import token_risk
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.injection import INJECTOR, FaultInjector, base_backend
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
    m = model.with_backends(kernels.ScaledMM(INJECTOR, injector, "triton-order"), engine="reference")
    ref = m.logits(toks)[0][-1:]
    injector.fault, injector.targets = FAULTS["F9c"], {m.linears[n][0].data_ptr() for n in m.linears}
    bad = m.logits(toks)[0][-1:]
    top2 = torch.topk(ref.double(), 2).values[0]
    deviation = float((ref.double() - bad.double()).abs().max())
    assert 0 < deviation < float(top2[0] - top2[1])  # the logits moved, by less than the margin
    assert token_risk(ref, bad)["flagged"] == 0


@pytest.mark.parametrize("regime, n_prompts, tokens, rows", [("native", 3, 3, 256), ("pow2", 1, 4, 5)])
def test_batched_runs_equal_the_runs_one_after_another(regime, n_prompts, tokens, rows, monkeypatch):
    """The 22 teacher-forced runs in batches (what CUDA runs: all 22 at once; or, with BATCH_ROWS
    at 5 rows, batches of 5, 5, 5, 5 and 2 runs) against the same runs one after another (the
    oracle): every field of the result, bit for bit (logit deviations as floats, first divergences,
    C7 counts), on prompts of different lengths (packed prefill) and decode."""
    from requant.audit.phases import injection

    model = load_model(DEFAULT_CHECKPOINT, regime=regime, engine="reference")
    toks = _tokens(model, n_prompts)
    one_by_one = run_injection(model, toks, REFERENCE_PAIR, tokens=tokens, batched=False)
    monkeypatch.setattr(injection, "BATCH_ROWS", rows)
    batched = run_injection(model, toks, REFERENCE_PAIR, tokens=tokens, batched=True)
    assert batched == one_by_one
    changed = [f for f, s in one_by_one["faults"].items() if not s["all"]["logits_bitwise_equal"]]
    assert "F7" in changed and "F8" not in changed  # the runs differ from each other: blocks kept apart
