"""benchmarks/bench_portable.py's report on the CPU: the spread of a repetition's rates and the
Markdown written from a record generated here (the GPU run measures; this checks what is written)."""

import importlib
import random

from hypothesis import given
from hypothesis import strategies as st


def _bench():
    return importlib.import_module("benchmarks.bench_portable")


@given(st.lists(st.floats(1e-4, 10.0), min_size=1, max_size=9), st.integers(1, 8192))
def test_spread_is_the_rates_at_the_median_and_the_extremes(secs, work):
    got = _bench()._spread(secs, work)
    assert got["tok_s"] == work / sorted(secs)[len(secs) // 2]
    assert got["tok_s_min"] == work / max(secs) and got["tok_s_max"] == work / min(secs)
    assert got["tok_s_min"] <= got["tok_s"] <= got["tok_s_max"]


def test_markdown_of_a_record():
    rng = random.Random(0)

    def engine():
        v = sorted(rng.uniform(10, 9000) for _ in range(3))
        return {"tok_s": v[1], "tok_s_min": v[0], "tok_s_max": v[2]}

    rec = {"shape": "qwen3-8b", "backend": "triton", "device": "H200", "commit": "c", "prefill": {}, "decode": {}}
    for n in (2048, 8192):
        rec["prefill"][n] = {"fast": engine(), "portable": engine(), "portable_over_fast_time": rng.uniform(1, 2)}
    rec["decode"][1] = {"fast": engine(), "portable": engine(), "portable_over_fast_time": rng.uniform(1, 2)}
    rec["profile"] = {"portable": {"decode_b1_step": {"_exp2_kernel": 0.25, "_dense_kernel": 0.5, "other": 0.125}}}
    md = _bench().markdown(rec)
    f = rec["prefill"][8192]["fast"]
    want = f"| {f['tok_s']:.0f} [{f['tok_s_min']:.0f}-{f['tok_s_max']:.0f}] |"
    line = next(x for x in md.splitlines() if x.startswith("| prefill 1 x 8192"))
    assert want in line and line.endswith(f"| {rec['prefill'][8192]['portable_over_fast_time']:.2f} |")
    assert "portable, decode_b1_step: 0.875 ms GPU: _exp2_kernel 0.250; _dense_kernel 0.500; other 0.125" in md


def test_markdown_of_a_tokens_sweep():
    """Each swept (tokens, warps) gets a row; a setting whose bits differ is marked loudly."""
    rng = random.Random(1)
    rows = []
    for tokens, warps, same in [(None, 4, True), (4, 8, True), (16, 8, False)]:
        v = sorted(rng.uniform(1000, 9000) for _ in range(3))
        rows.append({"tokens": tokens, "warps": warps, "ms": 2048e3 / v[1], "tok_s": v[1], "tok_s_min": v[0],
                     "tok_s_max": v[2], "same_bits": same})  # fmt: skip
    rec = {"shape": "qwen3-8b", "backend": "triton", "device": "H100", "commit": "c", "prefill": {}, "decode": {}}
    rec["tokens_sweep"] = {2048: rows}
    md = _bench().markdown(rec).splitlines()
    at = md.index("Portable prefill 1 x 2048, the attention's tokens per program and warps (median [min-max]):")
    body = md[at + 4 : at + 7]
    assert [x.split(" | ")[0] for x in body] == ["| default", "| 4", "| 16"]
    for x, r in zip(body, rows):
        assert f"| {r['ms']:.1f} | {r['tok_s']:.0f} [{r['tok_s_min']:.0f}-{r['tok_s_max']:.0f}] |" in x
    assert body[0].endswith("| yes |") and body[2].endswith("| **NO** |")
