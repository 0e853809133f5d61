"""The paired bootstrap (requant.eval.bootstrap) against cases with a known answer.

Independent references: closed forms. Identical arms have ratio 1 in every replicate;
a log-likelihood shift proportional to each document's words (ll + k*w) multiplies word
perplexity by exactly exp(-k) on every resample; a constant shift c per document gives
exp(-n*c/W) on the full set; a synthetic population with a known mean per-word shift has
true change 100*(exp(-mu) - 1), which a 90% interval should cover in about 90% of
independent experiments.
"""

import math

import numpy as np
import pytest

from requant.eval.bootstrap import Docs, corpus_metrics, paired_bootstrap, resample_indices


def _docs(n=30, seed=0):
    rng = np.random.default_rng(seed)
    words = rng.integers(800, 4000, size=n)
    nbytes = words * 5 + rng.integers(0, 400, size=n)
    ll = -words * (4.0 + rng.normal(0.0, 0.5, size=n))
    return Docs(ll=ll.astype(np.float64), words=words.astype(np.int64), nbytes=nbytes.astype(np.int64))


def _shift(d: Docs, per_doc: np.ndarray) -> Docs:
    return Docs(ll=d.ll + per_doc, words=d.words, nbytes=d.nbytes)


def test_identical_arms_give_zero_and_a_zero_interval():
    d = _docs()
    out = paired_bootstrap({"native": d, "nearest": Docs(d.ll.copy(), d.words, d.nbytes)}, replicates=500, seed=3)
    a = out["arms"]["nearest"]
    assert a["delta_pct"] == 0.0 and a["ci90"] == [0.0, 0.0]
    assert a["byte_delta_pct"] == 0.0 and a["byte_ci90"] == [0.0, 0.0]
    assert out["documents"] == 30 and out["bootstrap"] == {"replicates": 500, "seed": 3, "level": 0.9}
    assert "delta_pct" not in out["arms"]["native"]


def test_word_proportional_shift_gives_a_known_ratio_on_every_resample():
    d = _docs()
    k = 0.01  # every document loses 0.01 nats per word
    out = paired_bootstrap({"native": d, "ceiling": _shift(d, -k * d.words)}, replicates=400, seed=1)
    want = 100.0 * math.expm1(k)
    a = out["arms"]["ceiling"]
    assert a["delta_pct"] == pytest.approx(want, rel=1e-9)
    assert a["ci90"] == pytest.approx([want, want], rel=1e-9)
    # byte-proportional shift: byte perplexity ratio known on every resample
    out = paired_bootstrap({"native": d, "mse": _shift(d, k * d.nbytes)}, replicates=400, seed=1)
    want = 100.0 * math.expm1(-k)
    assert out["arms"]["mse"]["byte_delta_pct"] == pytest.approx(want, rel=1e-9)
    assert out["arms"]["mse"]["byte_ci90"] == pytest.approx([want, want], rel=1e-9)


def test_constant_shift_full_set_value_and_metrics():
    d = _docs(n=12)
    c = -3.0
    out = paired_bootstrap({"native": d, "nearest": _shift(d, np.full(12, c))}, replicates=300, seed=0)
    W, B = int(d.words.sum()), int(d.nbytes.sum())
    assert out["arms"]["nearest"]["delta_pct"] == pytest.approx(100.0 * math.expm1(-12 * c / W), rel=1e-9)
    assert out["arms"]["nearest"]["byte_delta_pct"] == pytest.approx(100.0 * math.expm1(-12 * c / B), rel=1e-9)
    lo, hi = out["arms"]["nearest"]["ci90"]
    assert lo <= hi
    # lm-eval's aggregates, recomputed with math.fsum: exp(-sum ll / sum words), bits per byte
    ll = math.fsum(d.ll.tolist())
    m = corpus_metrics(d)
    assert m["word_perplexity"] == pytest.approx(math.exp(-ll / W), rel=1e-12)
    assert m["byte_perplexity"] == pytest.approx(math.exp(-ll / B), rel=1e-12)
    assert m["bits_per_byte"] == pytest.approx(-ll / B / math.log(2), rel=1e-12)


def test_interval_coverage_on_a_known_population():
    """400 independent synthetic evaluations of 40 documents; per document the arm's per-word
    shift is drawn from N(mu, sigma), so the true word-perplexity change is 100*(exp(-mu) - 1).
    A 90% percentile interval should cover it in about 90% of experiments (the percentile
    bootstrap runs slightly below nominal at n = 40; binomial sd of the estimate 1.5%)."""
    mu, sigma, n, trials = -0.002, 0.004, 40, 400
    truth = 100.0 * math.expm1(-mu)
    rng = np.random.default_rng(12345)
    covered = 0
    for t in range(trials):
        d = _docs(n=n, seed=1000 + t)
        delta = rng.normal(mu, sigma, size=n)
        out = paired_bootstrap({"native": d, "arm": _shift(d, d.words * delta)}, replicates=1000, seed=t)
        lo, hi = out["arms"]["arm"]["ci90"]
        covered += lo <= truth <= hi
    assert 0.84 <= covered / trials <= 0.95, covered / trials


def test_probe_decomposition_known_share():
    d = _docs()
    kn, kp = 0.001, 0.05  # nearest costs a little, the probe a lot (per-word shifts)
    arms = {"native": d, "nearest": _shift(d, -kn * d.words), "probe": _shift(d, -kp * d.words)}
    out = paired_bootstrap(arms, replicates=300, seed=0)
    share = (math.exp(kp) - math.exp(kn)) / (math.exp(kp) - 1.0)
    dec = out["decomposition"]
    assert dec["probe_mismatch_share"] == pytest.approx(share, rel=1e-9)
    assert dec["ci90"] == pytest.approx([share, share], rel=1e-9)  # independent of the resample here
    assert (
        paired_bootstrap({"native": d, "nearest": arms["nearest"]}, replicates=10)["decomposition"][
            "probe_mismatch_share"
        ]
        is None
    )
    same = paired_bootstrap({"native": d, "nearest": d, "probe": d}, replicates=10)["decomposition"]
    assert same["probe_mismatch_share"] is None  # 0/0: the probe did no damage


def test_refusals_and_seeding():
    d = _docs(n=5)
    with pytest.raises(ValueError, match="baseline"):
        paired_bootstrap({"nearest": d})
    other = Docs(d.ll, d.words + 1, d.nbytes)
    with pytest.raises(ValueError, match="other documents"):
        paired_bootstrap({"native": d, "nearest": other})
    with pytest.raises(ValueError, match="other documents"):
        paired_bootstrap(
            {
                "native": Docs(d.ll, d.words, d.nbytes, np.arange(5)),
                "nearest": Docs(d.ll, d.words, d.nbytes, np.arange(1, 6)),
            }
        )
    a, b = resample_indices(7, 50, seed=9), resample_indices(7, 50, seed=9)
    assert np.array_equal(a, b) and a.shape == (50, 7) and a.min() >= 0 and a.max() < 7
    assert not np.array_equal(a, resample_indices(7, 50, seed=10))
    with pytest.raises(ValueError):
        resample_indices(0, 10, 0)
