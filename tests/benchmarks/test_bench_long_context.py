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
