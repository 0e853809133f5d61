"""benchmarks/bench_runtime.py on the CPU: a smoke run on the embedded default with the
emulated pair (the GPU run is the lead's). Checks the record's structure and that each
ratio is its two medians divided (recomputed here); speeds themselves are not asserted."""

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return importlib.import_module("benchmarks.bench_runtime")


def test_cpu_smoke_run(tmp_path):
    pytest.importorskip("transformers")
    bench = _bench()
    out = tmp_path / "out"
    assert (
        bench.main(
            [
                "--device",
                "cpu",
                "--backends",
                "reference",
                "--out",
                str(out),
                "--prefill",
                "24",
                "--batches",
                "2",
                "--new-tokens",
                "3",
                "--reps",
                "2",
                "--det-prompts",
                "1",
                "--det-new-tokens",
                "2",
            ]
        )
        == 0
    )
    rec = json.loads((out / "bench_runtime.json").read_text())
    (e,) = rec["checkpoints"]
    names = {
        "reference-cutlass-order native",
        "reference-cutlass-order pow2",
        "reference-triton-order native",
        "reference-triton-order pow2",
        "transformers bf16",
    }
    assert set(e["rows"]) == names
    for r in e["rows"].values():
        assert set(r) == {"prefill 24", "decode 2"}
        for v in r.values():
            assert len(v["reps"]) == 2 and v["min"] <= v["median"] <= v["max"] and v["min"] > 0
    for b in ("reference-cutlass-order", "reference-triton-order"):
        for k, ratio in e["pow2_over_native"][b].items():
            assert ratio == e["rows"][f"{b} pow2"][k]["median"] / e["rows"][f"{b} native"][k]["median"]
    det = e["determinism"]
    assert det["summary"].startswith("pow2: 1/1 identical; native: ") and det["batch_invariant"]
    md = (out / "bench_runtime.md").read_text()
    assert "pow2 / native" in md and "| transformers bf16 |" in md
