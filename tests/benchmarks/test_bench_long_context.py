"""benchmarks/bench_long_context.py on the CPU: its --smoke path (the attention's two paths and
the split sweep on tiny shapes under TRITON_INTERPRET=1). Checks the record's structure, that each
ratio is the two recorded times divided (recomputed here), that a context within one split gives
the unsplit walk's bits and that the fused fold gives split + combine's; speeds themselves are
not asserted (the GPU run is the integrator's)."""

import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch

if not _launch.INTERPRET:
    pytest.skip("Triton was imported without TRITON_INTERPRET=1", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return importlib.import_module("benchmarks.bench_long_context")


def test_smoke_run(tmp_path):
    bench = _bench()
    out = tmp_path / "out"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    rec = json.loads((out / "bench_long_context.json").read_text())
    sp = rec["split_prices"]
    assert sp["production_split"] == 512 and set(sp["ms"]) == {"decode@200", "prefill@130"}
    for row in sp["ms"].values():
        times = {k: v for k, v in row.items() if isinstance(v, float) and k != "fixed_over_best"}
        assert set(times) == {"512", "64", "128", "unsplit"}
        assert row["best"] == min(times, key=times.get)
        assert row["fixed_over_best"] == times["512"] / times[row["best"]]
        assert row["one_split_equals_unsplit"] is True  # contexts < 512: one split
    pp = rec["paths"]
    assert pp["split"] == 512 and set(pp["ms"]) == {"decode@200", "prefill@130"}
    for name, row in pp["ms"].items():
        assert row["split_over_fold"] == row["split"] / row["fold"]
        assert row["fold_equals_split"] is True
        assert row["dispatch"] == "split"  # the smoke shapes have fewer programs than FOLD_MIN_PROGRAMS
    md = (out / "bench_long_context.md").read_text()
    assert "Attention alone," in md and "Attention alone by path" in md


def test_bad_parts_is_refused(tmp_path, capsys):
    assert _bench().main(["--smoke", "--out", str(tmp_path), "--parts", "paths,nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --parts paths,nope")


def test_smoke_fold_sweep(tmp_path):
    bench = _bench()
    assert bench.main(["--smoke", "--out", str(tmp_path), "--parts", "fold"]) == 0
    fp = json.loads((tmp_path / "bench_long_context.json").read_text())["fold"]
    assert set(fp["ms"]) == {f"chunk {n}@{p}" for n in (8, 40, 100) for p in (0, 520)}
    for name, row in fp["ms"].items():
        n = int(name.split()[1].split("@")[0])
        assert row["programs"] == -(-n // 32) * 2  # blocks of 32 tokens (group 2), 2 KV heads
        assert row["fold_equals_split"] is True
    assert fp["suggested_fold_min_programs"] == bench.fold_threshold(fp["ms"])


@given(st.lists(st.tuples(st.integers(1, 600), st.booleans(), st.floats(0.1, 2.0)), min_size=1, max_size=12))
def test_fold_threshold_is_the_least_count_from_which_the_fold_never_loses(cells):
    rows = {
        str(i): {"programs": p, "eligible": e, "fold": 1.0, "split": ratio} for i, (p, e, ratio) in enumerate(cells)
    }
    got = _bench().fold_threshold(rows)
    eligible = [r for r in rows.values() if r["eligible"]]
    if got is None:  # the largest eligible launch loses (or none is eligible)
        assert not eligible or any(
            r["fold"] > r["split"] for r in eligible if r["programs"] == max(x["programs"] for x in eligible)
        )
        return
    assert all(r["fold"] <= r["split"] for r in eligible if r["programs"] >= got)
    below = [r["programs"] for r in eligible if r["programs"] < got]
    if below:  # the next count down has a losing launch: no smaller threshold holds
        assert any(r["fold"] > r["split"] for r in eligible if r["programs"] == max(below))
