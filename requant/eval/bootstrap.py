"""Paired bootstrap over documents for perplexity ratios between arms.

lm-eval reports no standard error for word/byte perplexity or bits per byte (they are
ratios of sums, aggregated once over the corpus). What a user needs is not the spread
of one arm's perplexity but whether an arm moves it: the ratio ppl_arm / ppl_native on the
same documents. Per document d the logged samples give the log-likelihood ll_a[d] under
arm a, the word count w[d] and the byte count b[d] (the same for every arm). Then

    ppl_a = exp(-sum_d ll_a[d] / sum_d w[d])             (word perplexity; bytes alike)
    ppl_a / ppl_native = exp(-(sum ll_a - sum ll_native) / sum w)
    delta_pct = 100 * (ppl_a / ppl_native - 1)

Why documents are the unit, and the probe decomposition: docs/eval.md#intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LEVEL = 0.90


@dataclass(frozen=True)
class Docs:
    """One arm's per-document log-likelihoods with the shared word and byte counts."""

    ll: np.ndarray  # float64 [n]
    words: np.ndarray  # int64 [n]
    nbytes: np.ndarray  # int64 [n]
    doc_ids: np.ndarray | None = None  # int64 [n]: which documents (lm-eval doc_id), in order


def corpus_metrics(d: Docs) -> dict:
    """lm-eval's aggregates on the full set (same formulas as its weighted_perplexity and
    bits_per_byte, summed in float64)."""
    ll = float(np.sum(d.ll))
    w, b = int(np.sum(d.words)), int(np.sum(d.nbytes))
    return {
        "word_perplexity": float(np.exp(-ll / w)),
        "byte_perplexity": float(np.exp(-ll / b)),
        "bits_per_byte": float(-ll / b / np.log(2)),
        "loglikelihood": ll,
        "words": w,
        "bytes": b,
    }


def resample_indices(n: int, replicates: int, seed: int) -> np.ndarray:
    """[replicates, n] document indices drawn with replacement (seeded)."""
    if n < 1:
        raise ValueError("the bootstrap needs at least one document")
    if replicates < 1:
        raise ValueError("the bootstrap needs at least one replicate")
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n))


def _ppl(ll_sums: np.ndarray, count_sums: np.ndarray) -> np.ndarray:
    return np.exp(-ll_sums / count_sums)


def interval(values: np.ndarray, level: float = LEVEL) -> list[float]:
    lo, hi = np.percentile(values, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return [float(lo), float(hi)]


def paired_bootstrap(arms: dict[str, Docs], baseline: str = "native", replicates: int = 2000, seed: int = 0) -> dict:
    """Per arm: the full-set metrics, and for every arm but the baseline the word and byte
    perplexity change against it (delta_pct, byte_delta_pct) with percentile intervals
    (ci90, byte_ci90); plus the probe decomposition. Arms must share document counts."""
    if baseline not in arms:
        raise ValueError(f"the baseline arm {baseline!r} is missing")
    base = arms[baseline]
    n = len(base.ll)
    for name, d in arms.items():
        same_ids = d.doc_ids is None or base.doc_ids is None or np.array_equal(d.doc_ids, base.doc_ids)
        if (
            len(d.ll) != n
            or not same_ids
            or not np.array_equal(d.words, base.words)
            or not np.array_equal(d.nbytes, base.nbytes)
        ):
            raise ValueError(f"arm {name!r} was scored on other documents than {baseline!r}")
    idx = resample_indices(n, replicates, seed)
    w_rep = base.words[idx].sum(axis=1).astype(np.float64)
    b_rep = base.nbytes[idx].sum(axis=1).astype(np.float64)
    ll_rep = {name: d.ll[idx].sum(axis=1) for name, d in arms.items()}
    full = {name: corpus_metrics(d) for name, d in arms.items()}
    out: dict = {"arms": {}, "documents": n, "bootstrap": {"replicates": replicates, "seed": seed, "level": LEVEL}}
    for name, d in arms.items():
        row = {k: full[name][k] for k in ("word_perplexity", "byte_perplexity", "bits_per_byte")}
        if name != baseline:
            for _key, cnt_full, cnt_rep, label in (
                ("word_perplexity", full[name]["words"], w_rep, ""),
                ("byte_perplexity", full[name]["bytes"], b_rep, "byte_"),
            ):
                diff = full[name]["loglikelihood"] - full[baseline]["loglikelihood"]
                row[f"{label}delta_pct"] = float(100.0 * np.expm1(-diff / cnt_full))
                rep = 100.0 * np.expm1(-(ll_rep[name] - ll_rep[baseline]) / cnt_rep)
                row[f"{label}ci90"] = interval(rep)
        out["arms"][name] = row
    out["decomposition"] = decomposition(full, ll_rep, w_rep, baseline)
    return out


def decomposition(full: dict, ll_rep: dict, w_rep: np.ndarray, baseline: str) -> dict:
    res = {
        "probe_mismatch_share": None,
        "ci90": None,
        "definition": "(ppl_probe - ppl_nearest) / (ppl_probe - ppl_native), word perplexity",
    }
    if not {"probe", "nearest", baseline} <= set(full):
        return res
    num = full["probe"]["word_perplexity"] - full["nearest"]["word_perplexity"]
    den = full["probe"]["word_perplexity"] - full[baseline]["word_perplexity"]
    if den == 0:
        return res
    res["probe_mismatch_share"] = float(num / den)
    p, q, r = (_ppl(ll_rep[k], w_rep) for k in ("probe", "nearest", baseline))
    ok = (p - r) != 0
    if ok.any():
        res["ci90"] = interval((p[ok] - q[ok]) / (p[ok] - r[ok]))
    return res
