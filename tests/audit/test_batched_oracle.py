"""The audit's two paths against each other and against a direct comparison, on pairs and kernels
drawn from a space (a seeded generator), not a list.

Space: pair shapes (two orders, one order twice, the same backend twice, two kernels of one order,
the kernel under test first or second), the pair resolved as the command resolves --backends, with
--order or by conform's fingerprint; kernels (tests/audit/generated_kernels.py, MODULE:FUNCTION names
that spell them): a legal order (cutlass, triton, fused), or that order with outputs one bf16 spacing
off (low bit flipped) at every element, one in 10**3 or one in 10**5, at every M, only at M <= 8, only
at M > 64, only under native scales, only in one Linear kind (one weight shape); both regimes,
prefill and decode (M = 1, 2, 9), prompts 1 or 4 (M = 17 or 83), matrix v1 (no C8: the kernel-fault
evidence is counted all the same) or v2. N_CASES cases, about 55 s of CPU.

Per case: the batched path (audit/batched.py) equals the per-cell path (REQUANT_AUDIT_PER_CELL=1)
on every JSON field but timings; the per-cell path's per-layer rows equal both kernels run here on
the operands the audit captured (spied at cells.LinearQueue.put) and compared here; its kernel
faults (backend, regime, M, layers, elements, first element) equal this test's own comparison of
each kernel with its declared order; its verdict names the first faulty kernel. The orders
(generated_kernels.ORDERS) and the bf16 distance are written from their definitions, independently
of requant.kernels.reference and audit/compare.py.
"""

import random

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit import cells as cells_mod
from requant.audit.batched import PER_CELL_ENV
from requant.audit.catalogue.matrix import load_matrix, matrix_path
from requant.audit.pair import resolve_pair
from requant.audit.suite import run_audit
from requant.checkpoint import open_checkpoint
from tests.audit.generated_kernels import CONDITIONS, DENSITIES, MOE_CONDITIONS, ORDERS, Spec

MODULE = "tests.audit.generated_kernels"
BUILTIN = {f"reference-{o}": o for o in ORDERS}
SHAPES = ("two-orders", "one-order-twice", "same-backend-twice", "two-kernels-one-order")
# the embedded default's Linear weight shapes [N, K]: q and o, k and v, gate and up, down
KINDS = ((256, 256), (128, 256), (768, 256), (256, 768))
N_CASES = 8  # two per pair shape; about 2 minutes of one loaded core
N_MOE_CASES = 4  # one per pair shape and MoE condition


def draw(seed: int, conditions=CONDITIONS) -> dict:
    """One case: the pair (MODULE:FUNCTION names and built-ins), --order or the fingerprint, the
    matrix, prompts, decode sizes. `conditions`: those the first kernel's cycles through."""
    r = random.Random(seed)
    shape = SHAPES[seed % len(SHAPES)]

    def kernel(order, first=False):
        # the first kernel's condition and density cycle with the seed (every one within N_CASES cases);
        # the rest, and every kernel's kind and salt, are drawn
        cond = conditions[seed % len(conditions)] if first else r.choice(conditions)
        density = list(DENSITIES)[(seed // 3) % len(DENSITIES)] if first else r.choice(list(DENSITIES))
        return f"{MODULE}:{Spec(order, cond, density, r.choice(KINDS), r.randrange(1 << 20)).name}"

    o1 = r.choice(list(ORDERS))
    o2 = r.choice([o for o in ORDERS if o != o1])
    if shape == "two-orders":
        names = [kernel(o1, True), f"reference-{o2}"]
    elif shape == "one-order-twice":
        names = [kernel(o1, True), f"reference-{o1}"]
    elif shape == "same-backend-twice":
        names = [kernel(o1, True)] * 2
    else:
        names = [kernel(o1, True), kernel(o1)]
    if r.random() < 0.5:
        names.reverse()  # the kernel under test first or second
    return {
        "seed": seed,
        "shape": shape,
        "names": tuple(names),
        "with_order": r.random() < 0.5,
        # 4 prompts (prefill M = 83) where a kernel is wrong at M > 64 only, else drawn (M = 17 or 83)
        "prompts": 4 if any("_large_" in n for n in names) else r.choice([1, 4]),
        "batches": r.choice([(1,), (2, 9)]),
        "matrix": r.choice(["v1", "v2"]) if "fused-order" not in (o1, o2) else "v2",  # v1: no fused row, no C8
    }


def spec_of(name: str):
    """The callable this test runs for a member: its own order formula for a built-in emulation."""
    return ORDERS[BUILTIN[name]] if name in BUILTIN else Spec.parse(name.partition(":")[2])


def resolve(names: tuple, order: str | None):
    """The pair as `requant audit --backends A,B [--order ORDER]` resolves it (audit/pair.py:
    kernels.ScaledMM members, nothing registered): (pair, fingerprint failure or None)."""
    res = resolve_pair(names, order, "cpu")
    return res.kernels, res.failure


def declared(backend) -> str:
    return kernels.emulation_of(backend).removeprefix("reference-")


def _strip(res):
    res = {k: v for k, v in res.items() if k not in ("timings", "wall_seconds")}
    if "decode" in res:
        res["decode"] = {k: v for k, v in res["decode"].items() if k != "timings"}
    return res


def _ordinal(bits):
    b = bits.to(torch.int64) & 0xFFFF
    return torch.where(b >= 0x8000, 0x8000 - b, b)


def _compare(ya, yb) -> dict:
    """The per-layer figures, from the definitions: differing bit patterns, largest distance on the
    monotone bf16 line (NaN on either side: 2**31)."""
    ne = ya.view(torch.int16) != yb.view(torch.int16)
    if not bool(ne.any()):
        return {"bitwise_equal": True, "mismatches": 0, "max_ulp": 0}
    d = (_ordinal(ya.view(torch.int16)) - _ordinal(yb.view(torch.int16))).abs()
    d = torch.where(torch.isnan(ya) | torch.isnan(yb), 2**31, d)
    return {"bitwise_equal": False, "mismatches": int(ne.sum()), "max_ulp": int(d.max())}


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint(DEFAULT_CHECKPOINT)


def _pair(case):
    """Resolve the case's pair: --order (each kernel's own order), or the fingerprint, which only a
    kernel wrong on conform's vectors may fail (then --order audits it, as the command says)."""
    users = [n for n in dict.fromkeys(case["names"]) if n not in BUILTIN]
    orders = ",".join(spec_of(n).order for n in users)
    pair, failure = resolve(case["names"], orders if case["with_order"] else None)
    if failure is not None:
        assert spec_of(failure["kernel"]).condition != "legal", failure
        pair, failure = resolve(case["names"], orders)
    assert failure is None
    return pair


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    from requant.checkpoint.synthetic import generate

    return open_checkpoint(generate("tiny-moe", tmp_path_factory.mktemp("moe") / "m", seed=6))


@pytest.mark.parametrize("seed", range(N_CASES))
def test_generated_pairs_batched_equals_per_cell_equals_direct(seed, ckpt, monkeypatch):
    _case_equal(draw(seed), ckpt, monkeypatch)


@pytest.mark.parametrize("seed", range(N_MOE_CASES))
def test_generated_moe_pairs_batched_equals_per_cell_equals_direct(seed, moe_ckpt, monkeypatch):
    """tiny-moe (8 experts of one shape per Linear kind, top 2: experts with no token, one, many; the
    batched path evaluates each kind's experts as one group): the kernel under test wrong in some
    experts only (odd), in one weight shape (kind: every expert Linear, or attention), at decode sizes,
    or legal; every pair shape."""
    res = _case_equal(draw(seed, MOE_CONDITIONS), moe_ckpt, monkeypatch)
    ms = {(phase, r["m"] > 1) for phase in ("prefill", "decode") for r in _rows(res, phase) if ".experts." in r["name"]}
    assert {("prefill", True), ("decode", False)} <= ms  # experts with many rows, with one
    assert res["decode"]["experts_without_tokens"]  # and (Linear, step) operand sets without a token


def _case_equal(case, ckpt, monkeypatch):
    pair = _pair(case)
    spied = []
    put = cells_mod.LinearQueue.put

    def spy(self, key, labelled, wt):
        spied.append((self.regime, labelled, wt))
        return put(self, key, labelled, wt)

    kw = dict(phases=("prefill", "decode"), decode_batches=case["batches"], decode_steps=1, keep_cells="all")
    kw["matrix"] = load_matrix(matrix_path(case["matrix"]))
    monkeypatch.setattr(cells_mod.LinearQueue, "put", spy)
    monkeypatch.setenv(PER_CELL_ENV, "1")
    want = run_audit(ckpt, pair, case["prompts"], "cpu", **kw)
    monkeypatch.setattr(cells_mod.LinearQueue, "put", put)
    monkeypatch.delenv(PER_CELL_ENV)
    got = run_audit(ckpt, pair, case["prompts"], "cpu", **kw)
    assert _strip(got) == _strip(want), case
    _check_direct(want, spied, pair, case)
    return want


def _rows(res, phase):
    return res["per_layer"] if phase == "prefill" else res["decode"]["per_layer"]


def _check_direct(res: dict, spied: list, pair, case) -> None:
    fns = {str(b): spec_of(str(b)) for b in pair}
    declared_of = {str(b): declared(b) for b in pair}  # the order the pair declares (--order or fingerprint)
    rows = {("prefill", r["regime"], r["name"]): r for r in res["per_layer"]}
    rows |= {("decode", r["regime"], f"{r['name']}@b{r['batch']}.t{r['step']}"): r for r in res["decode"]["per_layer"]}
    faults = {"prefill": {}, "decode": {}}  # (backend, regime, m) -> [order key, layers, elements, first]
    seen = 0
    for regime, labelled, wt in spied:
        for i, (label, act) in enumerate(labelled):
            phase = "decode" if "@b" in label else "prefill"
            outs = {str(b): fns[str(b)](act.a, wt.w, act.s_a, wt.s_w) for b in dict.fromkeys(pair)}
            row = rows[(phase, regime, label)]
            assert {k: row[k] for k in ("bitwise_equal", "mismatches", "max_ulp")} == _compare(
                outs[str(pair[0])], outs[str(pair[1])]
            ), (case, label, regime)
            assert (row["m"], row["k"], row["n"]) == (act.a.shape[0], wt.w.shape[1], wt.w.shape[0])
            seen += 1
            for b, y in outs.items():
                ref = ORDERS[declared_of[b]](act.a, wt.w, act.s_a, wt.s_w)
                ne = (y.view(torch.int16) != ref.view(torch.int16)).reshape(-1)
                if not bool(ne.any()):
                    continue
                at = int(ne.nonzero()[0])
                r_, c_ = divmod(at, y.shape[1])
                bits = (int(y.view(torch.int16)[r_, c_]) & 0xFFFF, int(ref.view(torch.int16)[r_, c_]) & 0xFFFF)
                # the scorer's order: regime, then (decode) batch and step, then Linear, then backend
                name, _, at_ = label.partition("@")
                # (batch, step) from the label: an expert's operand sets are the steps it was routed at
                when = tuple(int(v[1:]) for v in at_.split(".")) if at_ else ()
                order_key = (when, [n for n, _, _ in _names(spied, regime, phase)].index(name))
                g = faults[phase].setdefault((b, regime, act.a.shape[0]), [order_key, 0, 0, None])
                g[1] += 1
                g[2] += int(ne.sum())
                if g[3] is None or order_key < g[0]:
                    g[0] = order_key
                    g[3] = {"layer": label, "index": [r_, c_], "got": f"0x{bits[0]:04x}", "want": f"0x{bits[1]:04x}"}
    assert seen == len(rows)  # every per-layer row compared here
    for phase, groups in (("prefill", res["kernel_faults"]), ("decode", res["decode"]["kernel_faults"])):
        assert {(g["backend"], g["regime"], g["m"]): (g["layers"], g["elements"], g["first"]) for g in groups} == {
            k: (v[1], v[2], v[3]) for k, v in faults[phase].items()
        }, (case, phase)
        assert all(g["checks"] == ["C8"] and g["variant"] == f"B.{declared_of[g['backend']]}" for g in groups)
    first_bad = [g["backend"] for g in res["kernel_faults"] + res["decode"]["kernel_faults"]]
    if first_bad:
        assert res["verdict"].startswith(f"audit failed: kernel {first_bad[0]} is faulty"), case
    else:
        assert "is faulty" not in res["verdict"]
        # no fault proven: every scored check behaved, or the verdict names what failed
        assert res["verdict"].startswith("audit passed") == (
            res["per_layer_summary"]["pow2"]["bitwise_equal"] == res["per_layer_summary"]["pow2"]["layers"]
            and res["decode"]["per_layer_summary"]["pow2"]["bitwise_equal"]
            == res["decode"]["per_layer_summary"]["pow2"]["layers"]
            and res["scorecard"]["false_positives"] + res["decode"]["scorecard"]["false_positives"] == 0
            and res["scorecard"]["false_negatives"] + res["decode"]["scorecard"]["false_negatives"] == 0
        )


def _names(spied, regime, phase="prefill"):
    """The Linears of one regime and phase in the order the audit put them (the scorer's order)."""
    return [
        (lab[0][0].split("@")[0], r, w)
        for r, lab, w in spied
        if r == regime and ("@b" in lab[0][0]) == (phase == "decode")
    ]


def test_the_generator_covers_its_space():
    """The ten drawn cases span every pair shape, both positions of the kernel under test, --order
    and the fingerprint, legal and faulty kernels of every condition, every density, 1 and 4 prompts,
    both decode size sets, both matrices."""
    cases = [draw(s) for s in range(N_CASES)]
    assert {c["shape"] for c in cases} == set(SHAPES)
    assert {c["with_order"] for c in cases} == {True, False} and {c["prompts"] for c in cases} == {1, 4}
    assert {c["batches"] for c in cases} == {(1,), (2, 9)} and {c["matrix"] for c in cases} == {"v1", "v2"}
    assert {c["names"][0] in BUILTIN for c in cases} == {True, False}  # user kernel second and first
    specs = [spec_of(n) for c in cases for n in c["names"] if n not in BUILTIN]
    assert {s.condition for s in specs} == set(CONDITIONS)
    assert {s.density for s in specs if s.condition != "legal"} == set(DENSITIES)


def test_a_pair_of_one_order_is_compared_not_shared(ckpt):
    """reference-cutlass-order beside a kernel declared in the CUTLASS order
    that returns zeros at M <= 8. The batched path said 168/168 decode layers bitwise equal (one
    shared cell compared with itself); every decode row now differs, and the verdict names it."""
    name = f"{MODULE}:zeros_small"
    names = ("reference-cutlass-order", name)
    pair, _ = resolve(names, "cutlass-order")
    res = run_audit(
        ckpt, pair, 1, "cpu", phases=("prefill", "decode"), decode_batches=(1,), decode_steps=1,
        matrix=load_matrix(matrix_path("v2")),
    )  # fmt: skip
    dec = res["decode"]["per_layer_summary"]
    assert dec["pow2"]["bitwise_equal"] == dec["native"]["bitwise_equal"] == 0 and dec["pow2"]["layers"] == 42
    assert res["per_layer_summary"]["pow2"]["bitwise_equal"] == 42  # prefill: M = 17, the CUTLASS order
    assert res["decode"]["scorecard"]["false_positives"] == 0 and res["kernel_faults"] == []
    assert {(g["backend"], g["m"], g["layers"]) for g in res["decode"]["kernel_faults"]} == {(name, 1, 42)}
    assert res["verdict"].startswith(f"audit failed: kernel {name} is faulty") and "decode M=1" in res["verdict"]
