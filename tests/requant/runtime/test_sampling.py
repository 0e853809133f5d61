"""requant.runtime.sampling: the counter-based sampler, against an independent plain-Python implementation
of its documented definition (hashlib, math, fractions, bisect; no torch), on fixed keys; the
chooser alone vs in a batch; greedy against the runtime's own argmax; and the fast engine's
sampling under the Triton interpreter (one tiny case).

References: `_Independent` below (written from the definition in requant/runtime/sampling.py and docs/runtime.md: SHA-256
of the documented key bytes, Cody-Waite + Taylor exp from Python floats, a sort by (-logit, id),
top-k, top-p by exact rationals, inverse CDF by bisect over cumulative integer weights, the
logprob's exact integer sum); math.exp / math.log for the accuracy of exp64 / log64; Model.greedy
(torch.argmax) for greedy choice.
"""

import bisect
import hashlib
import itertools
import math
import os
import struct
from fractions import Fraction

import pytest
import torch

# As tests/requant/runtime/test_fast.py: at collection, before any test can import Triton, so that
# the fast-engine case below runs under the interpreter whatever ran first in this process.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from requant.runtime.sampling import (  # noqa: E402
    Chooser,
    SamplingParams,
    choose_row,
    exp64,
    generate,
    log64,
    prompt_key,
    resolve,
    row_logprob,
    uniform_int,
)

LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")


class _Independent:
    """The documented sampler in plain Python floats and integers."""

    @staticmethod
    def uniform(seed, key, t):
        kb = key.encode()
        msg = b"requant-sample-v1" + struct.pack("<Q", seed) + struct.pack("<Q", len(kb)) + kb + struct.pack("<Q", t)
        return int(hashlib.sha256(msg).hexdigest()[:32], 16)

    @staticmethod
    def exp(x):
        if x < -64.0:
            return 0.0
        k = round(x * INV_LN2)
        r = (x - k * LN2_HI) - k * LN2_LO
        p = 1.0 / math.factorial(13)
        for n in range(12, -1, -1):
            p = p * r + 1.0 / math.factorial(n)
        return math.ldexp(p, k)

    @staticmethod
    def log(z):
        m, e = math.frexp(z)
        if m < math.sqrt(0.5):
            m, e = 2 * m, e - 1
        s = (m - 1) / (m + 1)
        q = 0.0
        for n in range(23, 0, -2):
            q = q * (s * s) + 1.0 / n
        return e * LN2_HI + (e * LN2_LO + 2 * s * q)

    @classmethod
    def choose(cls, row, temperature, top_k, top_p, seed, key, t):
        top = max(row)
        if temperature == 0:
            return row.index(top)
        w = [math.floor(cls.exp((v - top) / temperature) * 2**40) for v in row]
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))
        if top_k:
            order = order[:top_k]
        cum = list(itertools.accumulate(w[i] for i in order))
        if top_p < 1:
            need = math.ceil(Fraction(top_p) * cum[-1])
            cum = cum[: next(n for n, c in enumerate(cum) if c >= need) + 1]
        r = cls.uniform(seed, key, t) * cum[-1] // 2**128
        return order[bisect.bisect_right(cum, r)]

    @classmethod
    def logprob(cls, row, token):
        top = max(row)
        hi = lo = 0
        for v in row:
            e = cls.exp(v - top) * 2**40
            hi += math.floor(e)
            lo += math.floor((e - math.floor(e)) * 2**40)
        return (row[token] - top) - cls.log(Fraction(hi * 2**40 + lo, 2**80).__float__())


def _row(seed, vocab=300):
    g = torch.Generator().manual_seed(seed)
    row = (torch.randn(vocab, generator=g) * 4).to(torch.bfloat16).to(torch.float32)  # bf16 values: many ties
    row[7] = row[3] = row.max()  # two maxima: greedy takes 3
    return row


CASES = [
    (0.0, 0, 1.0),
    (1.0, 0, 1.0),
    (0.7, 5, 1.0),
    (1.3, 0, 0.5),
    (2.0, 40, 0.9),
    (0.05, 0, 1.0),
]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_choices_equal_the_independent_implementation(temperature, top_k, top_p):
    for rs in range(3):
        row = _row(rs)
        vals = row.tolist()
        for seed, key, t in [(0, "", 0), (1, "a", 5), (2**64 - 1, "ключ", 1000), (7, "x" * 100, 2**40)]:
            p = SamplingParams(temperature, top_k, top_p, seed, key)
            want = _Independent.choose(vals, temperature, top_k, top_p, seed, key, t)
            assert choose_row(row, p, t) == want, (rs, seed, key, t)
        for tok in (0, 3, 150):
            assert row_logprob(row, tok).hex() == _Independent.logprob(vals, tok).hex()


def test_greedy_takes_the_lowest_id_of_the_maxima_and_uniform_is_keyed():
    assert choose_row(_row(0), SamplingParams(), 9) == 3
    assert uniform_int(3, "k", 4) == _Independent.uniform(3, "k", 4)
    us = {uniform_int(s, k, t) for s in (0, 1) for k in ("a", "b") for t in (0, 1)}
    assert len(us) == 8  # each of seed, key and position changes the number


def test_exp64_and_log64_are_accurate_and_match_python_floats():
    xs = [0.0, -0.0, -1e-17, -0.3465735902799726, -0.5, -1.0, -10.0, -63.99, -64.0, -64.5, -1e30]
    g = torch.Generator().manual_seed(5)
    xs += (-torch.rand(2000, generator=g, dtype=torch.float64) * 64).tolist()
    got = exp64(torch.tensor(xs, dtype=torch.float64)).tolist()
    for x, v in zip(xs, got):
        assert v.hex() == _Independent.exp(x).hex(), x
        if x >= -64:
            assert abs(v - math.exp(x)) <= math.ulp(math.exp(x)), x
        else:
            assert v == 0.0
    for z in [1.0, 1.5, 2.0, 3.0, 1000.5, 151936.0, 1 + 2**-40]:
        assert log64(z) == _Independent.log(z)
        assert abs(log64(z) - math.log(z)) <= 4 * math.ulp(math.log(z)), z


def test_frequencies_follow_the_softmax():
    row = torch.tensor([0.0, math.log(2.0), math.log(5.0), -100.0], dtype=torch.float32)
    counts = [0] * 4
    n = 3000
    params = SamplingParams(temperature=1.0, seed=11, key="f")
    for t in range(n):
        counts[choose_row(row, params, t)] += 1
    probs = torch.softmax(row.double(), 0).tolist()
    for c, p in zip(counts, probs):
        assert abs(c / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (counts, probs)


def test_chooser_rows_do_not_depend_on_the_batch():
    rows = torch.stack([_row(s) for s in range(3)])
    reqs = [resolve(SamplingParams(temperature=1.0, top_k=10, seed=s), [s]) for s in range(3)]
    batch = Chooser(reqs, [4, 9, 2])
    got = batch(0, rows).tolist()
    for j in range(3):
        alone = Chooser([reqs[j]], [[4, 9, 2][j]])
        assert alone(0, rows[j : j + 1]).tolist() == [got[j]]
        assert alone.steps[0] == batch.steps[j]
    assert batch.steps[1][0].position == 9 and batch.steps[1][0].logprob == row_logprob(rows[1], got[1]).hex()


def test_params_are_checked_naming_the_field():
    for bad, field in [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed=2**64), "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**bad).check()
    assert (
        resolve(SamplingParams(), [1, 2]).key
        == prompt_key([1, 2])
        == hashlib.sha256(struct.pack("<2q", 1, 2)).hexdigest()
    )


def test_greedy_generation_is_the_runtimes_argmax_and_batch_invariant(micro):
    from requant.runtime import load_model

    m = load_model(micro, engine="reference")
    prompts = [[5, 9, 11, 3], [7, 8], [1, 2, 3, 4, 5, 6]]
    greedy = generate(m, prompts, SamplingParams(), 6)
    assert [s.ids for s in greedy] == m.greedy(prompts, 6)  # reference: torch.argmax in Model.generate
    eos = greedy[0].ids[2]  # row 0 stops at its first eos (included); the others run on or stop at theirs
    stopped = generate(m, prompts, SamplingParams(), 6, eos_id=eos)
    assert [s.ids for s in stopped] == m.greedy(prompts, 6, eos_id=eos)
    assert len(stopped[0].ids) == greedy[0].ids.index(eos) + 1
    assert all([st.token for st in s.steps] == s.ids for s in stopped)
    params = [SamplingParams(temperature=t, top_p=0.9, seed=j) for j, t in enumerate((0.8, 1.0, 1.5))]
    batch = generate(m, prompts, params, 6)
    for j in range(3):
        (alone,) = generate(m, [prompts[j]], [params[j]], 6)
        assert alone.ids == batch[j].ids and alone.steps == batch[j].steps


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter case is for CPU machines")
def test_fast_engine_sampling_under_the_interpreter(micro):
    from requant.kernels.triton import _launch

    if not _launch.INTERPRET:
        pytest.skip("Triton was imported without TRITON_INTERPRET=1")
    from requant.runtime import load_model

    fast = load_model(micro, engine="fast")
    prompts = [[5, 9, 11, 3], [7, 8]]
    params = [SamplingParams(temperature=1.0, seed=3), SamplingParams()]
    batch = generate(fast, prompts, params, 2)
    (alone,) = generate(fast, prompts[:1], params[:1], 2)
    assert alone.ids == batch[0].ids and alone.steps == batch[0].steps
    # the engine emitted what the chooser chose, from its own logits (reference: keep_logits + choose_row)
    forced = fast.generate(
        prompts, 2, keep_logits=True, choose=lambda step, lg: torch.tensor([s.ids[step] for s in batch])
    )
    for step, lg in enumerate(forced.step_logits):
        for j, s in enumerate(batch):
            assert choose_row(lg[j].cpu(), resolve(params[j], prompts[j]), len(prompts[j]) + step) == s.ids[step]
