"""The audit's two paths against each other and against a direct comparison, on pairs and kernels
drawn from a space (a seeded generator), not a list.

Space: pair shapes (two orders, one order twice, the same backend twice, two kernels of one order,
the kernel under test first or second), each order registered by --order's function or by conform's
fingerprint (declare_orders(pair, None)); kernels: a legal order (cutlass, triton, fused), or that
order with outputs one bf16 spacing off (low bit flipped) at every element, one in 10**3 or one in
10**5, at every M, only at M <= 8, only at M > 64, only under native scales, only in one Linear kind
(one weight shape); both regimes, prefill and decode (M = 1, 2, 9), prompts 1 or 5 (M = 17 or 130),
matrix v1 (no C8: the kernel-fault evidence is counted all the same) or v2.

Per case: the batched path (audit/batched.py) equals the per-cell path (REQUANT_AUDIT_PER_CELL=1)
on every JSON field but timings; the per-cell path's per-layer rows equal both kernels run here on
the operands the audit captured (spied at cells.LinearQueue.put) and compared here; its kernel
faults (backend, regime, M, layers, elements, first element) equal this test's own comparison of
each kernel with its declared order; its verdict names the first faulty kernel. The orders and the
bf16 distance are written here from their definitions (float64 accumulator, fp32 scales, torch's
round-half-even cast), independently of requant.kernels.reference and audit/compare.py.
"""

import random
from dataclasses import dataclass

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit import cells as cells_mod
from requant.audit.batched import PER_CELL_ENV
from requant.audit.custom_orders import declare_custom_orders
from requant.audit.matrix import load_matrix, matrix_path
from requant.audit.suite import run_audit
from requant.backends import declare_orders
from requant.checkpoint import open_checkpoint


def _acc(a, w):
    return (a.to(torch.float64) @ w.to(torch.float64).T).to(torch.float32)  # exact: |acc| < 2**24 here


ORDERS = {
    "triton-order": lambda a, w, s_a, s_w: ((_acc(a, w) * s_a.reshape(-1, 1)) * s_w.reshape(1, -1)).to(torch.bfloat16),
    "cutlass-order": lambda a, w, s_a, s_w: (s_a.reshape(-1, 1) * (s_w.reshape(1, -1) * _acc(a, w))).to(torch.bfloat16),
    "fused-order": lambda a, w, s_a, s_w: (_acc(a, w) * (s_a.reshape(-1, 1) * s_w.reshape(1, -1))).to(torch.bfloat16),
}
BUILTIN = {f"reference-{o}": o for o in ORDERS}
CONDITIONS = ("always", "m<=8", "m>64", "native", "kind")
DENSITIES = (1.0, 1e-3, 1e-5)
SHAPES = ("two-orders", "one-order-twice", "same-backend-twice", "two-kernels-one-order")
# the embedded default's Linear weight shapes [N, K]: q, k/v, o, gate/up, down
KINDS = ((256, 256), (128, 256), (256, 256), (768, 256), (256, 768))


def _all_pow2(s):
    mant, _ = torch.frexp(s.to(torch.float64))
    return bool(((mant == 0.5) & (s > 0)).all())


@dataclass(frozen=True)
class Spec:
    """A kernel: `order`, with the low bit of a `density` share of outputs flipped when `condition` holds."""

    order: str
    condition: str | None  # None: legal
    density: float = 1.0
    kind: tuple = ()
    salt: int = 0

    def applies(self, a, w, s_w) -> bool:
        m = a.shape[0]
        return {
            None: False,
            "always": True,
            "m<=8": m <= 8,
            "m>64": m > 64,
            "native": not _all_pow2(s_w),
            "kind": tuple(w.shape) == self.kind,
        }[self.condition]

    def __call__(self, a, w, s_a, s_w):
        y = ORDERS[self.order](a, w, s_a, s_w)
        if not self.applies(a, w, s_w):
            return y
        bits = y.view(torch.int16).clone().reshape(-1)
        if self.density < 1:  # a seeded hash of the flat index picks about density * numel elements
            i = torch.arange(bits.numel(), dtype=torch.int64)
            pick = ((i * 2654435761 + self.salt) % (1 << 32)) < int(self.density * (1 << 32))
        else:
            pick = torch.ones_like(bits, dtype=torch.bool)
        bits[pick] ^= 1
        return bits.view(torch.bfloat16).view_as(y)


def draw(seed: int) -> dict:
    """One case: the pair (names and kernels), --order or the fingerprint, prompts, decode sizes."""
    r = random.Random(seed)
    shape = SHAPES[seed % len(SHAPES)]

    def kernel(order):
        if r.random() < 0.25:
            return Spec(order, None)
        return Spec(order, r.choice(CONDITIONS), r.choice(DENSITIES), r.choice(KINDS), r.randrange(1 << 32))

    o1 = r.choice(list(ORDERS))
    o2 = r.choice([o for o in ORDERS if o != o1])
    user = f"tests.gen:k{seed}"
    if shape == "two-orders":
        members = [(user, kernel(o1)), (f"reference-{o2}", None)]
    elif shape == "one-order-twice":
        members = [(user, kernel(o1)), (f"reference-{o1}", None)]
    elif shape == "same-backend-twice":
        members = [(user, kernel(o1))] * 2
    else:
        members = [(user, kernel(o1)), (f"tests.gen:j{seed}", kernel(o1))]
    if r.random() < 0.5:
        members.reverse()  # the kernel under test first or second
    return {
        "seed": seed,
        "shape": shape,
        "members": members,
        "with_order": r.random() < 0.5,
        "prompts": r.choice([1, 5]),
        "batches": r.choice([(1,), (2, 9)]),
        "matrix": r.choice(["v1", "v2"]) if "fused-order" not in (o1, o2) else "v2",  # v1: no fused row, no C8
    }


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


def _register(case) -> tuple[tuple[str, str], dict]:
    """Register the user kernels; their orders by --order's function or by the fingerprint.
    Returns the pair and {name: the callable this test runs for it}."""
    fns = {}
    for name, spec in case["members"]:
        if spec is None:
            fns[name] = ORDERS[BUILTIN[name]]
        else:
            fns[name] = spec
            kernels.register_scaled_mm(name, spec)
    pair = tuple(n for n, _ in case["members"])
    users = [n for n in dict.fromkeys(pair) if n not in BUILTIN]
    if case["with_order"]:
        declare_orders(pair, ",".join(fns[n].order for n in users), "cpu")
    else:
        _, failure = declare_custom_orders(pair, None, "cpu")
        if failure is not None:  # only a kernel faulty on conform's vectors may fail the fingerprint
            assert fns[failure["kernel"]].condition is not None
            declare_orders(pair, ",".join(fns[n].order for n in users), "cpu")
    return pair, fns


def _declared(name: str) -> str:
    return kernels.EMULATION_OF[name].removeprefix("reference-")


@pytest.mark.parametrize("seed", range(10))
def test_generated_pairs_batched_equals_per_cell_equals_direct(seed, ckpt, monkeypatch):
    case = draw(seed)
    pair, fns = _register(case)
    try:
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
        _check_direct(want, spied, pair, fns, case)
    finally:
        for name in set(pair) - set(BUILTIN):
            kernels.unregister_scaled_mm(name)


def _check_direct(res: dict, spied: list, pair, fns, case) -> None:
    rows = {("prefill", r["regime"], r["name"]): r for r in res["per_layer"]}
    rows |= {("decode", r["regime"], f"{r['name']}@b{r['batch']}.t{r['step']}"): r for r in res["decode"]["per_layer"]}
    faults = {"prefill": {}, "decode": {}}  # (backend, regime, m) -> [order key, layers, elements, first]
    seen = 0
    for regime, labelled, wt in spied:
        for i, (label, act) in enumerate(labelled):
            phase = "decode" if "@b" in label else "prefill"
            outs = {b: fns[b](act.a, wt.w, act.s_a, wt.s_w) for b in dict.fromkeys(pair)}
            row = rows[(phase, regime, label)]
            assert {k: row[k] for k in ("bitwise_equal", "mismatches", "max_ulp")} == _compare(
                outs[pair[0]], outs[pair[1]]
            ), (case, label, regime)
            assert (row["m"], row["k"], row["n"]) == (act.a.shape[0], wt.w.shape[1], wt.w.shape[0])
            seen += 1
            for b, y in outs.items():
                ref = ORDERS[_declared(b)](act.a, wt.w, act.s_a, wt.s_w)
                ne = (y.view(torch.int16) != ref.view(torch.int16)).reshape(-1)
                if not bool(ne.any()):
                    continue
                at = int(ne.nonzero()[0])
                r_, c_ = divmod(at, y.shape[1])
                bits = (int(y.view(torch.int16)[r_, c_]) & 0xFFFF, int(ref.view(torch.int16)[r_, c_]) & 0xFFFF)
                # the scorer's order: regime, then (decode) batch and step, then Linear, then backend
                name = label.split("@")[0]
                order_key = (i, [n for n, _, _ in _names(spied, regime)].index(name))
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
        assert all(g["checks"] == ["C8"] and g["variant"] == f"B.{_declared(g['backend'])}" for g in groups)
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


def _names(spied, regime):
    """The Linears of one regime in the order the audit put them (the scorer's order)."""
    return [(lab[0][0].split("@")[0], r, w) for r, lab, w in spied if r == regime and "@b" not in lab[0][0]]


def test_the_generator_covers_its_space():
    """The ten drawn cases span every pair shape, both positions of the kernel under test, --order
    and the fingerprint, legal and faulty kernels, 1 and 5 prompts, both decode size sets."""
    cases = [draw(s) for s in range(10)]
    assert {c["shape"] for c in cases} == set(SHAPES)
    assert {c["with_order"] for c in cases} == {True, False} and {c["prompts"] for c in cases} == {1, 5}
    assert {c["batches"] for c in cases} == {(1,), (2, 9)} and {c["matrix"] for c in cases} == {"v1", "v2"}
    assert {c["members"][0][1] is None for c in cases} == {True, False}  # user kernel second and first
    specs = [s for c in cases for _, s in c["members"] if s is not None]
    assert None in {s.condition for s in specs} and len({s.condition for s in specs}) >= 4
    assert len({s.density for s in specs if s.condition}) >= 2


def zeros_small(a, w, s_a, s_w):
    """The issue's kernel: the CUTLASS order, but zeros at M <= 8."""
    y = ORDERS["cutlass-order"](a, w, s_a, s_w)
    return torch.zeros_like(y) if a.shape[0] <= 8 else y


def test_the_issue_pair_one_order_twice_is_compared_not_shared(ckpt):
    """Issue 38's first row: reference-cutlass-order beside a kernel declared in the CUTLASS order
    that returns zeros at M <= 8. The batched path said 168/168 decode layers bitwise equal (one
    shared cell compared with itself); every decode row now differs, and the verdict names it."""
    name = "tests.issue38:zeros_small"
    kernels.register_scaled_mm(name, zeros_small, order="cutlass-order")
    try:
        res = run_audit(
            ckpt, ("reference-cutlass-order", name), 1, "cpu", phases=("prefill", "decode"), decode_batches=(1,),
            decode_steps=1, matrix=load_matrix(matrix_path("v2")),
        )  # fmt: skip
    finally:
        kernels.unregister_scaled_mm(name)
    dec = res["decode"]["per_layer_summary"]
    assert dec["pow2"]["bitwise_equal"] == dec["native"]["bitwise_equal"] == 0 and dec["pow2"]["layers"] == 42
    assert res["per_layer_summary"]["pow2"]["bitwise_equal"] == 42  # prefill: M = 17, the CUTLASS order
    assert res["decode"]["scorecard"]["false_positives"] == 0 and res["kernel_faults"] == []
    assert {(g["backend"], g["m"], g["layers"]) for g in res["decode"]["kernel_faults"]} == {(name, 1, 42)}
    assert res["verdict"].startswith(f"audit failed: kernel {name} is faulty") and "decode M=1" in res["verdict"]
