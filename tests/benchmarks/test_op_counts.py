"""benchmarks/injection_ops.py and benchmarks/moe_capture_ops.py, each in its own process (they
replace the injector's accumulators with stand-ins for their run): the JSON they print, and what
their figures rest on, as regression guards: the injector stacks a layer's Linears of one input
(FaultInjector.shared_input issues ops), and the MoE block reads no route per expert (no nonzero or
unique among the host reads)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(out.stdout)


def test_injection_ops_counts_the_stacked_calls():
    r = _run("benchmarks.injection_ops", "--layers", "2", "--tokens", "2")
    assert (r["layers"], r["tokens"], r["prompts"]) == (2, 2, 8)
    assert r["launching_ops"] >= sum(r["by_frame"].values()) > 0
    assert r["by_frame"].get("injection.py:shared_input", 0) > 0
    assert r["by_frame"].get("injection.py:_faulted_at_once", 0) > 0


def test_moe_capture_reads_the_routes_once_per_block():
    r = _run("benchmarks.moe_capture_ops", "--layers", "1", "--batch", "2", "--steps", "1")
    assert r["preset"] == {"experts": 128, "top_k": 8, "layers": 1} and r["launching_ops"] > 0
    assert not {"nonzero", "_unique2", "unique"} & set(r["host_syncs"])
