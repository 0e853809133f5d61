"""Expert Linears of one shape evaluated as one group (audit/cells.py LinearQueue, audit/batched.py
start_linear's parts) equal the per-cell path (REQUANT_AUDIT_PER_CELL=1, each cell on its own), cell
by cell and row by row, on groups drawn from a seeded space: 1 to 6 experts of one drawn shape,
each with 1 to 3 operand sets (prefill-like, or decode steps) of 1, 2, 7 or 24 rows, power-of-two
and native scales mixed within the group, crafted rows (zero scales, NaN, large accumulators), two
experts with equal tensors in distinct objects; pairs drawn from two orders, one order twice, the
same backend twice, a kernel wrong at decode sizes and a kernel wrong in some experts only (its
weights' checksum odd). Dense Linears put between the experts keep their place in the results.
"""

import random

import pytest
import torch

from requant import kernels
from requant.audit import cells as cells_mod
from requant.audit.batched import PER_CELL_ENV
from requant.audit.catalogue.matrix import load_matrix, matrix_path
from requant.audit.records import Activations, Weights
from requant.backends import REFERENCE_PAIR
from tests.audit.conftest import make_operands
from tests.audit.custom_kernels import triton_order, wrong_at_decode

CHECKS = load_matrix(matrix_path("v2")).checks
N_CASES = 12


def wrong_in_some_experts(a, w, s_a, s_w):
    """The Triton order, with every output's low bit flipped where the weights' checksum is odd."""
    y = triton_order(a, w, s_a, s_w)
    if int(w.to(torch.int64).sum()) % 2 == 0:
        return y
    return (y.view(torch.int16) ^ 1).view(torch.bfloat16)


@pytest.fixture(scope="module")
def pairs():
    wrong = kernels.ScaledMM("tests-groups-wrong-at-decode", wrong_at_decode, "triton-order")
    some = kernels.ScaledMM("tests-groups-wrong-in-some-experts", wrong_in_some_experts, "triton-order")
    return [
        REFERENCE_PAIR,
        ("reference-triton-order", "reference-fused-order"),
        ("reference-triton-order", "reference-triton-order"),
        ("reference-cutlass-order", wrong),
        (some, "reference-triton-order"),
        ("reference-cutlass-order", some),
    ]


def draw(seed: int):
    """One group: [(key, [(label, Activations)], Weights)] in put order, dense Linears between."""
    r = random.Random(seed)
    k, n = r.choice([(96, 40), (64, 33), (200, 16), (32, 1)])
    items = []
    for e in range(r.choice([1, 2, 3, 6])):
        sets = [r.choice([1, 2, 7, 24]) for _ in range(r.choice([1, 1, 2, 3]))]
        act, wt = make_operands(seed * 100 + e, m=sum(sets), k=k, n=n, pow2=r.random() < 0.5)
        a, s_a = act.a.clone(), act.s_a.clone()
        if r.random() < 0.5:  # crafted rows
            s_a[0] = 0.0
            a[-1, : k // 2] = 127
            if r.random() < 0.3:
                s_a[-1] = float("nan")
        if e == 1 and r.random() < 0.5:  # an expert with the previous one's tensors (a distinct object)
            wt = Weights(items[-1][2].w.clone(), items[-1][2].s_w.clone())
        labelled, at = [], 0
        for i, m in enumerate(sets):
            labelled.append(
                (f"model.layers.0.mlp.experts.{e}.up_proj@s{i}", Activations(a[at : at + m], s_a[at : at + m]))
            )
            at += m
        items.append((f"model.layers.0.mlp.experts.{e}.up_proj", labelled, wt))
        if r.random() < 0.3:  # a dense Linear between experts: not grouped, keeps its place
            act, wt_d = make_operands(seed * 100 + 50 + e, m=r.choice([1, 9]), k=k, n=n)
            items.append((f"model.layers.0.self_attn.o_proj.{e}", [(f"dense{e}", act)], wt_d))
    return items, seed % 6, r.choice(["native", "pow2"])  # every pair twice in N_CASES


def _run(items, regime, backends, per_cell, monkeypatch):
    if per_cell:
        monkeypatch.setenv(PER_CELL_ENV, "1")
    else:
        monkeypatch.delenv(PER_CELL_ENV, raising=False)
    q = cells_mod.LinearQueue(regime, backends, CHECKS, window=2)
    for key, labelled, wt in items:
        q.put(key, labelled, wt)
    return q.results()


@pytest.fixture(params=[None, False], ids=["host-shortcuts", "device-path"])
def shortcuts(request, monkeypatch):
    from requant.audit import batched_stats

    monkeypatch.setattr(batched_stats, "HOST_SHORTCUTS", request.param)


@pytest.mark.parametrize("seed", range(N_CASES))
def test_grouped_experts_equal_the_per_cell_path(seed, pairs, shortcuts, monkeypatch):
    items, p, regime = draw(seed)
    backends = pairs[p]
    starts = []
    start = cells_mod.start_linear
    monkeypatch.setattr(cells_mod, "start_linear", lambda *a, **kw: starts.append(kw or a[5:]) or start(*a, **kw))
    got = _run(items, regime, backends, False, monkeypatch)
    monkeypatch.setattr(cells_mod, "start_linear", start)
    want = _run(items, regime, backends, True, monkeypatch)
    assert list(got) == list(want) == [key for key, _, _ in items]  # put order
    for key in want:
        assert len(got[key]) == len(want[key])
        for (row_g, cells_g), (row_w, cells_w) in zip(got[key], want[key]):
            assert row_g == row_w, (seed, key)
            assert len(cells_g) == len(cells_w) == 21 + len(dict.fromkeys(backends))
            for cg, cw in zip(cells_g, cells_w):
                assert cg == cw, (seed, key, cg.variant)
    experts = sum(cells_mod.groupable(key) for key, _, _ in items)
    assert sum(1 for s in starts if s and s[0] is not None) == (experts > 0)  # the experts: one group


def test_the_draws_cover_the_space():
    draws = [draw(s) for s in range(N_CASES)]
    assert {p for _, p, _ in draws} == set(range(6)) and {r for _, _, r in draws} == {"native", "pow2"}
    sizes = [len([i for i in items if cells_mod.groupable(i[0])]) for items, _, _ in draws]
    assert min(sizes) == 1 and max(sizes) >= 3
    assert any(len(lab) > 1 for items, _, _ in draws for _, lab, _ in items)  # decode-like operand sets
    assert any(not cells_mod.groupable(i[0]) for items, _, _ in draws for i in items)  # dense between
    rows = {act.a.shape[0] for items, _, _ in draws for _, lab, _ in items for _, act in lab}
    assert {1, 24} <= rows


@pytest.mark.parametrize("seed", [1, 3])
def test_a_group_the_batched_path_refuses_is_evaluated_linear_by_linear(seed, pairs, monkeypatch):
    """start_linear refusing the group (as it refuses an output that is not bf16 [M, N]): each Linear
    is evaluated alone, results equal to the per-cell path's, in put order."""
    items, p, regime = draw(seed)
    start = cells_mod.start_linear
    calls = []

    def refuse_groups(*a, **kw):
        calls.append(len(a) > 5)
        return None if len(a) > 5 else start(*a, **kw)

    monkeypatch.setattr(cells_mod, "start_linear", refuse_groups)
    got = _run(items, regime, pairs[p], False, monkeypatch)
    monkeypatch.setattr(cells_mod, "start_linear", start)
    want = _run(items, regime, pairs[p], True, monkeypatch)
    assert list(got) == [key for key, _, _ in items] and got == want
    assert calls.count(True) == 1 and calls.count(False) == len(items)
