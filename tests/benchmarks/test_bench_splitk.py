"""benchmarks/bench_splitk.py on the CPU: its --smoke path (tiny shapes under TRITON_INTERPRET=1,
bits only). Checks the record's rows (every M x shape, the split count > 1 so split-K ran, the
two configs' bits equal) and that a bad --m is refused; speeds are the GPU run's."""

import importlib.util
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
    spec = importlib.util.spec_from_file_location("bench_splitk", ROOT / "benchmarks" / "bench_splitk.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run(tmp_path):
    bench = _bench()
    assert bench.main(["--smoke", "--out", str(tmp_path), "--m", "1,8"]) == 0
    rec = json.loads((tmp_path / "bench_splitk.json").read_text())
    assert [(r["m"], r["linear"]) for r in rec["rows"]] == [(m, s[0]) for m in (1, 8) for s in bench.SMOKE]
    for r in rec["rows"]:
        assert r["config_for"] == "decode_splitk" and r["splits"] > 1 and r["same_bits"] is True
    assert "| same bits |" in (tmp_path / "bench_splitk.md").read_text()


def test_bad_m_is_refused(tmp_path, capsys):
    assert _bench().main(["--smoke", "--out", str(tmp_path), "--m", "1,x"]) == 2
    assert capsys.readouterr().err.startswith("error: --m 1,x")
