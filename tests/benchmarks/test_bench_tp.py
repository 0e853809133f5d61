"""benchmarks/bench_tp.py on the CPU (gloo): a smoke run on the embedded default, two
"NCCL settings" (ignored by gloo, so two launches of the same computation). Checks the
record's structure, the identical flags against what requant.tp guarantees (int32: every
degree = TP 1; bf16 at TP 1 = its int32 bits) and the digest comparison across launches;
speeds themselves are not asserted (the GPU run is the lead's)."""

import importlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return importlib.import_module("benchmarks.bench_tp")


def test_cpu_smoke_run(tmp_path):
    out = tmp_path / "out"
    assert (
        _bench().main(
            [
                "--device",
                "cpu",
                "--backends",
                "reference-triton-order",
                "--regimes",
                "pow2",
                "--tp",
                "2",
                "--batch",
                "2",
                "--prompt-len",
                "8",
                "--new-tokens",
                "3",
                "--reps",
                "1",
                "--nccl",
                "default;ALGO=Ring,NCHANNELS=1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rec = json.loads((out / "bench_tp.json").read_text())
    rows = rec["rows"]
    assert [(r["nccl"], r["reduce"], r["tp"]) for r in rows] == [
        (n, red, tp) for n in ("default", "ALGO=Ring,NCHANNELS=1") for red in ("int32", "bf16") for tp in (1, 2)
    ]
    for r in rows:
        assert r["timing"]["prefill_tok_s"] > 0 and r["timing"]["decode_tok_s"] > 0 and r["timing"]["decode_steps"] == 2
        assert r["identical"] == (r["reduce"] == "int32" or r["tp"] == 1)
        assert r["nccl_invariant"] is (None if r["nccl"] == "default" else True)  # the same bits in another launch
    digests = {(r["reduce"], r["tp"]): r["digest"] for r in rows}
    assert digests[("bf16", 1)] == digests[("int32", 1)] == digests[("int32", 2)] != digests[("bf16", 2)]
    assert "| default | default | reference-triton-order | pow2 | int32 | 2 |" in (out / "bench_tp.md").read_text()
