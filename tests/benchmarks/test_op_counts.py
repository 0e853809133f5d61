"""benchmarks/injection_ops.py and benchmarks/moe_capture_ops.py, each in its own process (they
replace the injector's accumulators with stand-ins for their run): the JSON they print, and what
their figures rest on, as regression guards: the injector stacks a layer's Linears of one input
(FaultInjector.shared_input issues ops), and the MoE block reads no route per expert (no nonzero or
unique among the host reads)."""

import json
import os
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


def test_whole_audit_ops_grouped_equal_and_fewer(tmp_path):
    """benchmarks/audit_whole_ops.py on the embedded default (one prompt, one decode step): the audits
    alone and grouped are equal, grouping dispatches fewer ops in the cells and the same in the captures."""
    out = tmp_path / "ops.json"
    args = ["--prompts", "1", "--decode-steps", "1", "--json", str(out)]
    subprocess.run(
        [sys.executable, "-m", "benchmarks.audit_whole_ops", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=600, check=True, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    r = json.loads(out.read_text())
    assert r["equal"] is True and r["layers"] == 6
    for kind in ("ops", "launches"):
        alone, grouped = r["alone"][kind], r["grouped"][kind]
        assert (
            0 < grouped["prefill_cells"] < alone["prefill_cells"]
            and 0 < grouped["decode_cells"] < alone["decode_cells"]
        )
        assert grouped["captures"] == alone["captures"] > 0
    assert r["grouped"]["launches"]["total"] < r["grouped"]["ops"]["total"]
