"""benchmarks/bench_splitk.py on the CPU: its --smoke path (tiny shapes under TRITON_INTERPRET=1,
bits only). Checks the record's rows (every M x shape, the split count > 1 so split-K ran, the
two configs' bits equal) and that a bad --m is refused; speeds are the GPU run's."""

import importlib.util
import json
import os
import random
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


def test_slots_sweep_keeps_the_bits(tmp_path):
    bench = _bench()
    assert bench.main(["--smoke", "--out", str(tmp_path), "--m", "1", "--slots", "1,8,64"]) == 0
    rec = json.loads((tmp_path / "bench_splitk.json").read_text())
    for r in rec["rows"]:
        splits = [r["slots"][v]["splits"] for v in ("1", "8", "64")]
        assert splits[0] == 1 and splits == sorted(splits)  # one split (the degenerate case) and more
        assert all(c["same_bits"] for c in r["slots"].values())
    assert rec["summary"] == {}  # nothing timed on the CPU
    assert "SLOTS sweep" in (tmp_path / "bench_splitk.md").read_text()


def _timed_rows(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for m in (1, 2, 4, 8, 12, 16):
        for name, n in (("qkv", 6144), ("o", 4096), ("gate_up", 24576)):
            dec = rng.uniform(0.01, 0.1)
            sl = {str(v): {"splits": 2, "same_bits": True, "ms": dec * rng.uniform(0.5, 1.3)} for v in (132, 264, 528)}
            rows.append({"m": m, "linear": name, "n": n, "decode_ms": dec, "slots": sl})
    return rows


@pytest.mark.parametrize("seed", range(8))
def test_the_summary_chooses_from_the_timed_rows(seed):
    bench = _bench()
    rows = _timed_rows(seed)
    sm = bench.summary(rows, 132)
    totals = {v: sum(r["slots"][v]["ms"] for r in rows) for v in ("132", "264", "528")}
    assert totals[str(sm["slots"])] == min(totals.values())
    split = [r for r in rows if r["n"] // 64 < 132]  # gate_up (384 tiles) is never split
    assert {r["linear"] for r in split} == {"qkv", "o"}
    won = {m: all(r["slots"][str(sm["slots"])]["ms"] < r["decode_ms"] for r in split if r["m"] == m)
           for m in (1, 2, 4, 8, 12, 16)}  # fmt: skip
    assert all(won[m] for m in won if m <= sm["split_k_max_m"])
    later = [m for m in sorted(won) if m > sm["split_k_max_m"]]
    assert not later or not won[later[0]]  # the first M past the choice loses somewhere
    assert bench.summary([{k: v for k, v in r.items() if k != "slots"} for r in rows], 132) == {}


def test_bad_slots_is_refused(tmp_path, capsys):
    assert _bench().main(["--smoke", "--out", str(tmp_path), "--slots", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --slots 0")
