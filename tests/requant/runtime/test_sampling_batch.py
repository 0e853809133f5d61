"""requant.runtime.sampling_batch (the batched chooser that Chooser runs) against the per-row definition,
bit for bit, on many random rows: ties, signed zeros, top-k, top-p, temperatures, greedy mixed
with sampled in one batch, rows whose kept set or draw reaches past the first prefix of the
order, small vocabularies and the 8B one (151,936).

References: requant.runtime.sampling.choose_row, row_logprob and logits_sha256 applied row by row (the
per-row definition, itself tested against an independent plain-Python implementation in
tests/requant/runtime/test_sampling.py); hashlib for the digests.
"""

import hashlib
import random

import pytest
import torch

from requant.runtime import sampling_batch
from requant.runtime.sampling import Chooser, SamplingParams, choose_row, logits_sha256, resolve, row_logprob
from requant.runtime.sampling_batch import choose_batch

TEMPS = [0.0, 0.0, 1e-3, 0.05, 0.7, 1.0, 1.0, 2.0, 50.0]
TOP_K = [0, 0, 1, 3, 50, 2000, 10**6]
TOP_P = [1.0, 1.0, 0.5, 0.9, 0.999, 1e-9]


def _rows(rng: random.Random, n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    scale = torch.tensor([rng.choice([0.0, 0.01, 1.0, 4.0, 12.0]) for _ in range(n)])[:, None]
    rows = (torch.randn(n, vocab, generator=g) * scale).to(torch.bfloat16).to(torch.float32)  # bf16: many ties
    for j in range(n):
        kind = rng.randrange(4)
        if kind == 0 and vocab > 3:  # tied maxima
            rows[j, vocab // 2] = rows[j, 1] = rows[j].max()
        elif kind == 1:  # signed zeros at the top
            rows[j] = -rows[j].abs()
            rows[j, 0], rows[j, vocab - 1] = -0.0, 0.0
    return rows


def _requests(rng: random.Random, n: int) -> list[SamplingParams]:
    return [
        SamplingParams(rng.choice(TEMPS), rng.choice(TOP_K), rng.choice(TOP_P), rng.randrange(2**64), f"r{j}")
        for j in range(n)
    ]


def _check_equal(rows, reqs, positions):
    tokens, ids, logprobs, digests = choose_batch(rows, reqs, positions)
    assert tokens.dtype == torch.int64 and tokens.tolist() == ids
    for j, (row, p, pos) in enumerate(zip(rows, reqs, positions)):
        want = choose_row(row, p, pos)
        assert ids[j] == want, (j, p, pos)
        assert logprobs[j] == row_logprob(row, want).hex(), (j, p)
        assert digests[j] == logits_sha256(row) == hashlib.sha256(row.numpy().tobytes()).hexdigest()
    return ids


@pytest.mark.parametrize("vocab,n,batches", [(1, 8, 2), (2, 16, 4), (7, 32, 6), (300, 48, 6), (5000, 24, 3)])
def test_batched_choice_equals_choose_row_on_random_rows(vocab, n, batches):
    rng = random.Random(vocab)
    for _ in range(batches):
        rows = _rows(rng, n, vocab)
        _check_equal(rows, _requests(rng, n), [rng.randrange(2**40) for _ in range(n)])


def test_batched_choice_equals_choose_row_at_the_8b_vocabulary():
    rng = random.Random(8)
    rows = _rows(rng, 12, 151936)
    rows[0] = 0.0  # flat: the draw lands past the first prefix of the order
    reqs = _requests(rng, 12)
    reqs[0] = SamplingParams(1.0, 0, 1.0, 5, "flat")
    reqs[1] = SamplingParams(2.0, 3000, 0.95, 6, "wide top-k")  # top_k past the prefix
    reqs[2] = SamplingParams(0.0, key="greedy")
    _check_equal(rows, reqs, list(range(12)))


def test_rows_past_the_prefix_take_the_whole_order(monkeypatch):
    """A small prefix makes every kind of row take the second pass: still the same bits."""
    monkeypatch.setattr(sampling_batch, "_PREFIX", 2)
    rng = random.Random(3)
    for vocab in (3, 40, 600):
        rows = _rows(rng, 24, vocab)
        _check_equal(rows, _requests(rng, 24), [rng.randrange(1000) for _ in range(24)])


def test_a_row_alone_equals_the_row_in_a_batch():
    rng = random.Random(11)
    rows, reqs = _rows(rng, 16, 1000), _requests(rng, 16)
    positions = list(range(100, 116))
    batch = choose_batch(rows, reqs, positions)
    for j in range(16):
        alone = choose_batch(rows[j : j + 1], reqs[j : j + 1], positions[j : j + 1])
        assert [x[0] for x in alone[1:]] == [x[j] for x in batch[1:]]


def test_record_false_skips_digests_and_logprobs_and_chooses_the_same():
    rng = random.Random(5)
    rows, reqs = _rows(rng, 6, 500), [resolve(p, [1]) for p in _requests(rng, 6)]
    full = Chooser(reqs, [3] * 6)
    bare = Chooser(reqs, [3] * 6, record=False)
    assert full(0, rows).tolist() == bare(0, rows).tolist()
    assert all(s[0].logits_sha256 is None and s[0].logprob is None for s in bare.steps)
    assert [s[0].token for s in bare.steps] == [s[0].token for s in full.steps]
    assert full.steps[2][0].logprob == row_logprob(rows[2], full.steps[2][0].token).hex()


def test_bad_logits_are_named():
    rows = torch.zeros(3, 10)
    rows[1, 4] = float("nan")
    reqs = [SamplingParams(key=f"k{j}") for j in range(3)]
    with pytest.raises(ValueError, match=r"request 1 \(k1\), position 8: the logits row is not finite"):
        choose_batch(rows, reqs, [7, 8, 9])
    with pytest.raises(ValueError, match="fp32 \\[batch, vocab\\]"):
        choose_batch(torch.zeros(10), reqs[:1], [0])
    with pytest.raises(ValueError, match="logits of shape"):
        Chooser(reqs, [1, 2, 3])(0, torch.zeros(2, 10))
