"""Dense Linears of one weight shape evaluated as one group (audit/cells.py LinearQueue with
cells.DENSE_GROUPS, as on CUDA; audit/batched.py start_linear's parts) equal each Linear evaluated
alone (REQUANT_AUDIT_GROUPS=0) and the per-cell path (REQUANT_AUDIT_PER_CELL=1), every field of every
row and cell, on the GPU's code path (batched_stats.HOST_SHORTCUTS = False). The Linears are a small
Qwen3 stack's, put in the audit's order: q/o share a shape, k/v another, gate/up, down; prefill-like
(one operand set) and decode-like (several). Degenerate cases: a group of one, groups cut by
GROUP_ELEMENTS, dense and expert Linears in one shape's group. And a whole audit of the embedded
default, grouped against REQUANT_AUDIT_GROUPS=0: every key of the JSON but timings equal.
"""

import pytest
import torch

from benchmarks.audit_equality import _strip, first_difference
from requant import kernels
from requant.audit import batched_stats
from requant.audit import cells as cells_mod
from requant.audit.batched import PER_CELL_ENV
from requant.audit.catalogue.faults import VARIANTS
from requant.audit.catalogue.matrix import load_matrix, matrix_path
from requant.audit.records import Activations
from requant.backends import REFERENCE_PAIR
from tests.audit.conftest import make_operands
from tests.audit.custom_kernels import triton_order

CHECKS = load_matrix(matrix_path("v2")).checks
H, KV, INTER = 32, 16, 48  # q/o [H, H], k/v [KV, H], gate/up [INTER, H], down [H, INTER]
SHAPES = {
    "self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
    "self_attn.o_proj": (H, H), "mlp.gate_proj": (INTER, H), "mlp.up_proj": (INTER, H), "mlp.down_proj": (H, INTER),
}  # fmt: skip


def wrong_in_some_layers(a, w, s_a, s_w):
    """The Triton order, with every output's low bit flipped where the weights' checksum is odd: a
    kernel fault in some members of a group only."""
    y = triton_order(a, w, s_a, s_w)
    if int(w.to(torch.int64).sum()) % 2 == 0:
        return y
    return (y.view(torch.int16) ^ 1).view(torch.bfloat16)


SOME = kernels.ScaledMM("tests-dense-groups-wrong-in-some-layers", wrong_in_some_layers, "triton-order")


def stack(seed: int, layers: int, sets: list[int], experts: int = 0):
    """[(key, [(label, Activations)], Weights)] in the audit's put order: each layer's seven Linears
    (then `experts` expert up projections of gate/up's shape and as many down projections); `sets`:
    the rows of each operand set (one: a prefill; several: decode steps). Scales pow2 or native by
    Linear, crafted rows (a zero scale, a large accumulator, a NaN scale) in some."""
    items, i = [], 0
    for layer in range(layers):
        leaves = [(f"model.layers.{layer}.{leaf}", shape) for leaf, shape in SHAPES.items()]
        leaves += [(f"model.layers.{layer}.mlp.experts.{e}.up_proj", (INTER, H)) for e in range(experts)]
        leaves += [(f"model.layers.{layer}.mlp.experts.{e}.down_proj", (H, INTER)) for e in range(experts)]
        for name, (n, k) in leaves:
            i += 1
            act, wt = make_operands(seed * 1000 + i, m=sum(sets), k=k, n=n, pow2=i % 3 == 0)
            a, s_a = act.a.clone(), act.s_a.clone()
            if i % 4 == 1:
                s_a[0] = 0.0
                a[-1, : k // 2] = 127
            if i % 11 == 5:
                s_a[-1] = float("nan")
            labelled, at = [], 0
            for j, m in enumerate(sets):
                label = name if len(sets) == 1 else f"{name}@b{m}.t{j}"
                labelled.append((label, Activations(a[at : at + m], s_a[at : at + m])))
                at += m
            items.append((name, labelled, wt))
    return items


def evaluate(items, regime, backends, monkeypatch, how: str):
    """LinearQueue's results, the progress advanced, and the group sizes (Linears a grouped start)."""
    monkeypatch.delenv(PER_CELL_ENV, raising=False)
    monkeypatch.delenv(cells_mod.GROUPS_ENV, raising=False)
    if how == "per-cell":
        monkeypatch.setenv(PER_CELL_ENV, "1")
    elif how == "alone":
        monkeypatch.setenv(cells_mod.GROUPS_ENV, "0")
    groups, start = [], cells_mod.start_linear

    def counted(regime, segs, wt, backends, bk, parts=None):
        if parts is not None:
            groups.append(len({id(p) for p in parts}))
        return start(regime, segs, wt, backends, bk, parts)

    monkeypatch.setattr(cells_mod, "start_linear", counted)
    advanced = []
    q = cells_mod.LinearQueue(regime, backends, CHECKS, advanced.append, window=3)
    for key, labelled, wt in items:
        q.put(key, labelled, wt)
    res = q.results()
    monkeypatch.setattr(cells_mod, "start_linear", start)
    return res, sum(advanced), sorted(groups)


@pytest.fixture
def dense_groups(monkeypatch):
    """Dense Linears grouped on the CPU, on the GPU's code path."""
    monkeypatch.setattr(cells_mod, "DENSE_GROUPS", True)
    monkeypatch.setattr(batched_stats, "HOST_SHORTCUTS", False)


CASES = {
    # name: (layers, operand sets' rows, experts, GROUP_ELEMENTS or None, pair, regime, group sizes)
    "prefill": (3, [7], 0, None, REFERENCE_PAIR, "native", [3, 6, 6, 6]),
    "decode": (2, [1, 1, 8, 8], 0, None, (SOME, "reference-triton-order"), "pow2", [2, 4, 4, 4]),
    # one layer: down_proj is a group of one (each shape's q/o, k/v, gate/up pairs groups of two)
    "group-of-one": (1, [5], 0, None, ("reference-cutlass-order", SOME), "native", [1, 2, 2, 2]),
    # 9 rows: q/o (9 x 32 a Linear) cut after 3 Linears (864 >= 800), the 4th a group of one; gate/up
    # (9 x 48) after 2, twice; k/v (4 x 144) and down (2 x 288) within the bound
    "cut": (2, [9], 0, 800, REFERENCE_PAIR, "native", [1, 2, 2, 2, 3, 4]),
    # experts of gate/up's and of down's shape join the dense Linears' groups
    "mixed": (2, [1, 2], 2, None, ("reference-triton-order", "reference-triton-order"), "pow2", [4, 4, 6, 8]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dense_groups_equal_each_linear_alone_and_the_per_cell_path(case, dense_groups, monkeypatch):
    layers, sets, experts, bound, backends, regime, sizes = CASES[case]
    if bound is not None:
        monkeypatch.setattr(cells_mod, "GROUP_ELEMENTS", bound)
    items = stack(list(CASES).index(case), layers, sets, experts)
    grouped, adv_g, groups = evaluate(items, regime, backends, monkeypatch, "grouped")
    alone, adv_a, none = evaluate(items, regime, backends, monkeypatch, "alone")
    oracle, adv_o, _ = evaluate(items, regime, backends, monkeypatch, "per-cell")
    assert groups == sizes and none == []  # grouped as the case says; alone: no group at all
    assert sum(sizes) == len(items)
    assert list(grouped) == list(alone) == list(oracle) == [key for key, _, _ in items]  # put order
    assert adv_g == adv_a == adv_o == len(VARIANTS) * len(sets) * len(items)
    for key in oracle:
        assert len(grouped[key]) == len(alone[key]) == len(oracle[key]) == len(sets)
        for g, a, o in zip(grouped[key], alone[key], oracle[key]):
            assert g[0] == a[0] == o[0], (case, key)  # the pair's per-layer row
            assert len(g[1]) == len(o[1]) == len(VARIANTS) + len(dict.fromkeys(backends))
            for cg, ca, co in zip(g[1], a[1], o[1]):
                assert cg == ca == co, (case, key, co.variant)  # every field (dataclass equality)
    if backends[0] is SOME or backends[1] is SOME:  # the fault is in some members of the groups only
        faults = {k: any(c.fault for _, cs in v for c in cs) for k, v in oracle.items()}
        assert any(faults.values()) and not all(faults.values())


def test_dense_linears_are_grouped_on_cuda_only_by_default(monkeypatch):
    monkeypatch.setattr(cells_mod, "DENSE_GROUPS", None)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    dense, expert = "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.experts.7.up_proj"
    assert cells_mod.groupable(dense, cuda) and not cells_mod.groupable(dense, cpu)
    assert cells_mod.groupable(expert, cuda) and cells_mod.groupable(expert, cpu)
    monkeypatch.setattr(cells_mod, "DENSE_GROUPS", False)
    assert not cells_mod.groupable(dense, cuda) and cells_mod.groupable(expert, cuda)
    monkeypatch.setattr(cells_mod, "DENSE_GROUPS", True)
    assert cells_mod.groupable(dense, cpu) and not cells_mod.groupable(("not", "a", "name"), cpu)


def test_whole_audit_of_the_default_grouped_equals_each_linear_alone(dense_groups, monkeypatch):
    from requant import DEFAULT_CHECKPOINT
    from requant.audit.suite import run_audit
    from requant.checkpoint import open_checkpoint

    ck = open_checkpoint(DEFAULT_CHECKPOINT)
    out, groups = {}, []
    start = cells_mod.start_linear
    monkeypatch.setattr(cells_mod, "start_linear", lambda *a: groups.append(len(a) > 5) or start(*a))
    for flag in ("1", "0"):
        monkeypatch.setenv(cells_mod.GROUPS_ENV, flag)
        run = run_audit(ck, REFERENCE_PAIR, 2, "cpu", phases=("prefill", "decode"), keep_cells="all", decode_steps=2)
        out[flag] = _strip(run)
    assert first_difference(out["1"], out["0"]) is None
    assert out["1"]["cells"] > 0 and out["1"]["decode"]["cell_results"]
    # grouped: 4 shapes a regime and phase (6 layers: q/o, k/v, gate/up, down), then every Linear alone
    linears = 7 * 6 * 2 * 2
    assert groups.count(True) == 4 * 2 * 2 and groups.count(False) == linears
