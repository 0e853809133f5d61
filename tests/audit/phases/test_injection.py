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


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)), reason="needs an sm90 GPU"
)
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_batched_runs_on_cuda_equal_the_runs_one_after_another(preset, tmp_path):
    """CUDA's default (the 22 runs as one batch) against the runs one after another, cutlass,triton
    on the tiny synthetics (dense, and MoE: each expert's rows a block of its own run's tokens),
    both regimes: every field of the result, bit for bit."""
    from requant.checkpoint.synthetic import generate

    path = generate(preset, tmp_path / preset)
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


# The batched injection against its oracle, over a generated space (seeded generator). Space: the
# pair the audit was given (its triton-order member is the injector's base: a built-in emulation,
# or a user kernel of that order from tests/audit/generated_kernels.py, legal or faulty only at
# small M, only at large M, only in one Linear kind; the pair's shape: two orders, one order twice,
# the same kernel twice, two kernels of one order, the kernel under test first or second); the
# injected kernels (catalogue faults of audit/conform/fault_kernels.py, generated kernels faulty at
# every M, only at M <= 8, only at M > 64, only under native scales, only in one Linear kind, at
# every element or one in 10**3, legal ones; the same kernel twice in a row; the faulty one first
# or second); the regime; 1 to 4 prompts (prefill M = 17 to 83 packed, decode M = 1 to 4); 1 to 3
# tokens; runs per batch from 1 (BATCH_ROWS = prompts) to all of them; the model, dense (the embedded
# default) or MoE (tiny-moe: an expert gets the rows routed to it, so a block's rows there are as
# many as its own run routes, none at all for some: FaultInjector.rows_of).
INJ_CASES = 15
CATALOGUE = ("F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9a", "F9b", "F9c")
SMALL_M = 8


def _gen(r, order, conds, density=None):
    from tests.audit.generated_kernels import DENSITIES, Spec
    from tests.audit.test_batched_oracle import KINDS

    density = density or r.choice([d for d in DENSITIES if d != "d1e5"])  # 1 in 10**5: no element at this size
    return Spec(order, r.choice(conds), density, r.choice(KINDS), r.randrange(1 << 20))


def draw_injection(seed: int) -> dict:
    """One case: the pair (names, base order), the injected kernels ((label, spec) in run order),
    regime, prompts, tokens, BATCH_ROWS."""
    import random

    from tests.audit.generated_kernels import CONDITIONS

    r = random.Random(seed)
    base = ["builtin", "legal", "small", "large", "kind"][seed % 5]  # the triton-order member of the pair
    user = f"triton-order:{_gen(r, 'triton-order', [base], 'd1').name}" if base != "builtin" else None
    tri = user or "reference-triton-order"
    shape = ["two-orders", "one-order-twice", "same-kernel-twice", "two-kernels-one-order"][seed % 4]
    other = {
        "two-orders": "reference-cutlass-order",
        "one-order-twice": "reference-triton-order",
        "same-kernel-twice": tri,
        "two-kernels-one-order": f"triton-order:{_gen(r, 'triton-order', CONDITIONS).name}",
    }[shape]
    names = [tri, other] if r.random() < 0.5 else [other, tri]
    faults = []
    for _ in range(r.choice([2, 3])):
        # lean: the injection's own kernels (audit/phases/lean_faults.py); all of them every third
        # case, so that a Linear's faulted blocks share one accumulator and one bf16 cast (FaultInjector._faulted_at_once)
        kind = "lean" if seed % 3 == 2 else r.choice(["catalogue", "catalogue-small", "generated", "lean"])
        if kind == "generated":
            spec = ("generated", _gen(r, r.choice(["triton-order", "cutlass-order"]), CONDITIONS).name)
        else:
            spec = (kind, r.choice(CATALOGUE))
        faults.append(spec)
    if seed % 3 == 2:
        faults[r.randrange(len(faults))] = ("lean", "F4")  # the truncating one among blocks cast at once
    if seed % 3 == 0:
        faults.insert(r.randrange(len(faults) + 1), faults[0])  # the same kernel twice
    if seed % 4 == 1:
        faults.insert(r.choice([0, len(faults)]), ("generated", _gen(r, "triton-order", ["legal"]).name))
    prompts = r.choice([1, 2, 3, 4])
    runs = 2 * len(faults)
    per, tokens = [1, 2, 3, runs][seed % 4], r.choice([1, 2, 3])  # runs per batch, tokens
    # a batch whose M passes the base's threshold where one run's does not: decode M (2 tokens: one
    # decode step) = prompts, prefill M = 17 or 44 for 1 or 2 prompts, all runs in one batch
    if base == "small":
        prompts, per, tokens = max(prompts, 3), runs, max(tokens, 2)
    elif base == "large":
        prompts, per = min(prompts, 2), runs
    return {
        "seed": seed,
        "names": tuple(names),
        "base": base,
        "shape": shape,
        "faults": faults,
        "regime": ["native", "pow2"][(seed // 2) % 2],
        "model": ["dense", "moe"][(seed // 3) % 2],
        "prompts": prompts,
        "tokens": tokens,
        "rows": prompts * per,
    }


class _SmallOnly:
    """A catalogue fault only at M <= SMALL_M (the base order elsewhere)."""

    def __init__(self, fault):
        self.fault = fault

    def __call__(self, a, w, s_a, s_w):
        from requant.kernels.reference import scaled_mm_triton_order

        if a.shape[0] <= SMALL_M:
            return self.fault(a, w, s_a, s_w)
        return scaled_mm_triton_order(a, w, s_a, s_w)


def _kernels(case):
    """The pair as kernels.ScaledMM (a user member named triton-order:SPEC, called through the
    audit's guard) and the injected kernels {label: fn} in run order."""
    from requant.audit.catalogue.faults import accumulate_bf16_tiles
    from requant.audit.conform.fault_kernels import FAULTS
    from requant.audit.phases.lean_faults import lean_faults
    from requant.kernels.reference import accumulate
    from requant.user_kernel import guarded
    from tests.audit.generated_kernels import Spec

    def member(name):
        if name.startswith("reference-"):
            return kernels.lookup(name)
        order, _, spec = name.partition(":")
        return kernels.ScaledMM(name, guarded(name, Spec.parse(spec)), order)

    lean = lean_faults(accumulate, accumulate_bf16_tiles)
    faults = {}
    for i, (kind, spec) in enumerate(case["faults"]):
        fn = Spec.parse(spec) if kind == "generated" else (lean if kind == "lean" else FAULTS)[spec]
        faults[f"{i}:{kind}:{spec}"] = _SmallOnly(fn) if kind == "catalogue-small" else fn
    return tuple(member(n) for n in case["names"]), faults


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from requant.checkpoint.synthetic import generate

    moe = generate("tiny-moe", tmp_path_factory.mktemp("moe") / "m")
    return {
        (kind, r): load_model(path, regime=r, engine="reference")
        for kind, path in (("dense", DEFAULT_CHECKPOINT), ("moe", moe))
        for r in ("native", "pow2")
    }


def _bits(x):
    """A result's fields with every float as its hex (bit for bit; NaN equal to itself)."""
    if isinstance(x, float):
        return x.hex()
    if isinstance(x, dict):
        return {k: _bits(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_bits(v) for v in x]
    return x


@pytest.mark.parametrize("seed", range(INJ_CASES))
def test_generated_batched_injection_equals_the_runs_one_after_another(seed, models, monkeypatch):
    """The batched injection (_teacher_forced_blocks: the runs as blocks of one batch) against the
    independent reference, the same runs one after another (batched=False: each kernel called by
    the runtime on its own run's rows, no blocks, no row index), on a case drawn from the space
    above: every field of every run, bit for bit (floats by their hex)."""
    from requant.audit.phases import injection

    case = draw_injection(seed)
    pair, faults = _kernels(case)
    model = models[case["model"], case["regime"]]
    toks = _tokens(model, case["prompts"])
    monkeypatch.setattr(injection, "device_faults", lambda device: faults)
    one_by_one = run_injection(model, toks, pair, tokens=case["tokens"], batched=False)
    monkeypatch.setattr(injection, "BATCH_ROWS", case["rows"])
    batched = run_injection(model, toks, pair, tokens=case["tokens"], batched=True)
    assert set(batched) == set(one_by_one) and list(batched["faults"]) == list(faults), case
    for field in batched:
        if field != "faults":
            assert batched[field] == one_by_one[field], (case, field)
    for label, scopes in one_by_one["faults"].items():
        for scope, meas in scopes.items():
            got = _bits(batched["faults"][label][scope])
            for k, v in _bits(meas).items():
                assert got[k] == v, (case, label, scope, k)


def test_the_injection_generator_covers_its_space():
    """The drawn cases span every base, pair shape and regime, both positions of the base, catalogue,
    small-M, generated and lean kernels (all lean with several runs per batch), a kernel twice in a row, a legal kernel first and last, 1 to 4
    prompts, one run per batch and all runs in one batch, both models (all-lean cases on each) under both regimes."""
    cases = [draw_injection(s) for s in range(INJ_CASES)]
    assert {c["base"] for c in cases} == {"builtin", "legal", "small", "large", "kind"}
    assert {c["shape"] for c in cases} == {
        "two-orders",
        "one-order-twice",
        "same-kernel-twice",
        "two-kernels-one-order",
    }
    assert {c["regime"] for c in cases} == {"native", "pow2"}
    assert {(c["model"], c["regime"]) for c in cases} == {(m, r) for m in ("dense", "moe") for r in ("native", "pow2")}
    assert {c["model"] for c in cases if c["faults"] and all(k == "lean" for k, _ in c["faults"])} == {"dense", "moe"}
    assert {c["names"][0].startswith("reference-triton") or c["names"][0].startswith("triton-order:")
            for c in cases if c["shape"] == "two-orders"} == {True, False}  # fmt: skip
    kinds = [k for c in cases for k, _ in c["faults"]]
    assert set(kinds) == {"catalogue", "catalogue-small", "generated", "lean"}
    assert any(
        all(k == "lean" for k, _ in c["faults"]) and ("lean", "F4") in c["faults"] and c["rows"] >= 2 * c["prompts"]
        for c in cases
    )
    assert any(a == b for c in cases for a, b in zip(c["faults"], c["faults"][1:]))
    assert {c["prompts"] for c in cases} == {1, 2, 3, 4}
    assert {c["rows"] == c["prompts"] for c in cases} == {True, False}
    assert any(c["rows"] >= 2 * len(c["faults"]) * c["prompts"] for c in cases)  # all runs in one batch
    # a user base wrong only at M <= 8 (M > 64): one run's decode (prefill) M is, the batch's is not
    assert any(c["base"] == "small" and c["prompts"] <= SMALL_M < c["rows"] for c in cases)
    assert any(c["base"] == "large" and c["prompts"] <= 2 and c["rows"] >= 4 * c["prompts"] for c in cases)
