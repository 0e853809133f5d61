"""requant/tp/compare.py on results built here with differences planted at known places
(the reference: where they were planted)."""

import torch

from requant.tp import Result, compare
from requant.tp.compare import digest


def _result(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = [torch.randn(n, 16, generator=g).to(torch.bfloat16) for n in (3, 5)]
    steps = [torch.randn(2, 16, generator=g).to(torch.bfloat16) for _ in range(4)]
    return Result(logits, [[1, 2, 3, 4], [5, 6, 7, 8]], steps)


def _clone(r):
    return Result([t.clone() for t in r.logits], [list(i) for i in r.ids], [t.clone() for t in r.steps])


def test_identical():
    a = _result()
    c = compare(a, _clone(a))
    assert c["identical"] and c["logits_differing"] == 0 and c["logits_total"] == 8 * 16
    b = _clone(a)
    assert digest(a.logits, a.ids, a.steps) == digest(b.logits, b.ids, b.steps)


def test_planted_differences():
    a = _result()
    a.logits[1][2, 7], a.logits[1][4, 0] = 1.0, 0.25
    b = _clone(a)
    b.logits[1][2, 7], b.logits[1][4, 0] = 1.5, 3.25  # differences 0.5 and 3.0 (exact in bf16)
    b.ids[0][3] = 99
    b.ids[1][1] = 99
    b.steps[2][1, 5] += 1
    c = compare(a, b)
    assert not c["identical"]
    assert c["logits_first_diff"] == {"prompt": 1, "position": 2} and c["logits_differing"] == 2
    assert c["logits_max_abs_diff"] == 3.0
    assert c["tokens_first_diff"] == {"prompt": 1, "step": 1} and c["prompts_tokens_differ"] == 2
    assert c["steps_first_diff"] == {"step": 2, "prompt": 1}
    assert digest(a.logits, a.ids, a.steps) != digest(b.logits, b.ids, b.steps)


def test_signed_zero_is_a_difference():
    a = Result([torch.zeros(1, 4, dtype=torch.bfloat16)], [[1]], [])
    b = Result([torch.zeros(1, 4, dtype=torch.bfloat16)], [[1]], [])
    b.logits[0][0, 3] = -0.0
    c = compare(a, b)
    assert c["logits_first_diff"] == {"prompt": 0, "position": 0} and c["logits_differing"] == 1
    assert c["logits_max_abs_diff"] == 0.0  # bits differ, values do not
