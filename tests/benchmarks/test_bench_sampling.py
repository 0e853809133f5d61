"""benchmarks/bench_sampling.py on the CPU at a tiny vocabulary: the points it writes (every batch
and mode, recording and not) and their summaries.

References: statistics.median / min / max over the recorded repetitions; the mode table of the
script's docstring (greedy, sampled, and their -bare forms when Chooser takes record).
"""

import importlib
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    return importlib.import_module("benchmarks.bench_sampling")


def test_bench_sampling_writes_every_point(tmp_path):
    bench = _load()
    argv = ["--out", str(tmp_path), "--batches", "1,3", "--vocab", "50", "--devices", "cpu", "--reps", "2"]
    assert bench.main(argv) == 0
    res = json.loads((tmp_path / "sampling.json").read_text())
    assert res["chooser_has_record"] is True and res["gpu"] is None
    got = {(p["batch"], p["mode"], p["record"]) for p in res["points"]}
    modes = {("greedy", True), ("sampled", True), ("greedy-bare", False), ("sampled-bare", False)}
    assert got == {(b, m, r) for b in (1, 3) for m, r in modes}
    for p in res["points"]:
        s = p["seconds"]
        assert len(s["reps"]) == 2 and s["median"] == statistics.median(s["reps"])
        assert s["min"] == min(s["reps"]) and s["max"] == max(s["reps"])
        assert p["ms_per_row"] == 1e3 * s["median"] / p["batch"]
