"""The card's `deterministic` tag needs an audit by real kernels: an audit by the reference
emulations (the pair a CPU audit uses) proves the arithmetic, not the kernels, and the card says
so and names the backends. References: the audit report's own `backends` field, and the committed
GPU audit (benchmarks/results/default_gpu, cutlass vs triton), which keeps the tag in the example
card (test_example_card.py)."""

import json
from pathlib import Path

from huggingface_hub import ModelCard
from typer.testing import CliRunner

from requant.cli import app
from requant.publish.card import emulated_backends

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_an_emulated_audit_earns_no_deterministic_tag_and_says_so(pow2_copy):
    audit = json.loads((pow2_copy / "requant-audit.json").read_text())
    assert audit["backends"] == ["reference-cutlass-order", "reference-triton-order"]
    res = runner.invoke(app, ["card", str(pow2_copy)])
    assert res.exit_code == 0, res.output
    card = ModelCard((pow2_copy / "README.md").read_text())
    assert "deterministic" not in card.data.tags and "power-of-two-scales" in card.data.tags
    assert "(emulated kernels: `reference-cutlass-order`, `reference-triton-order`)" in card.text
    assert "PyTorch emulations" in card.text and "--backends cutlass,triton" in card.text


def test_which_backends_count_as_real_kernels():
    gpu = json.loads((ROOT / "benchmarks/results/default_gpu/audit_pow2/audit.json").read_text())
    assert gpu["backends"] == ["cutlass", "triton"] and emulated_backends(gpu) == []
    assert emulated_backends({"backends": ["cutlass", "reference-triton-order"]}) == ["reference-triton-order"]
    assert emulated_backends({}) != []  # a report that names no pair is no evidence of kernels
