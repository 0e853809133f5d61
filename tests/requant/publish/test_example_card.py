"""model_cards/examples/default-w8a8-pow2.md is what `requant card` renders today from the
committed GPU reports (benchmarks/results/default_gpu/) for the embedded default converted to
the nearest arm: the example stays current with the template, and the reports are tied to the
bytes the card describes.

Independent references: the manifest digests recorded by the GPU run (the audit of the
conversion it made there, and the determinism and eval runs of the default), hashlib over the
files converted here, and huggingface_hub.ModelCard parsing the example."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from huggingface_hub import ModelCard
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results" / "default_gpu"
EXAMPLE = ROOT / "model_cards" / "examples" / "default-w8a8-pow2.md"
runner = CliRunner()


def test_example_card_is_rendered_from_the_committed_reports(tmp_path, monkeypatch):
    out = tmp_path / "pow2"
    # config.json's provenance records a local source's path as given: the GPU run gave it
    # relative to the repository root, so the same spelling gives the same bytes
    monkeypatch.chdir(ROOT)
    assert (ROOT / "requant" / "data" / "default").resolve() == DEFAULT_CHECKPOINT.resolve()
    res = runner.invoke(app, ["convert", "requant/data/default", "--arm", "nearest", "-o", str(out)])
    assert res.exit_code == 0, res.output
    # the bytes converted here are the bytes the GPU run audited (convert is byte-exact)
    audit = json.loads((RESULTS / "audit_pow2" / "audit.json").read_text())
    assert audit["manifest_digest"] == "sha256:" + hashlib.sha256((out / "SHA256SUMS").read_bytes()).hexdigest()
    assert (out / "SHA256SUMS").read_bytes() == (RESULTS / "audit_pow2" / "SHA256SUMS").read_bytes()
    source = "sha256:" + hashlib.sha256((out / "SHA256SUMS.source").read_bytes()).hexdigest()
    for rep in (RESULTS / "determinism_default.json", RESULTS / "eval" / "eval.json"):
        assert json.loads(rep.read_text())["manifest_digest"] == source, rep
    shutil.copyfile(RESULTS / "audit_pow2" / "audit.json", out / "requant-audit.json")
    res = runner.invoke(
        app,
        [
            "card",
            str(out),
            "--eval",
            str(RESULTS / "eval" / "eval.json"),
            "--determinism",
            str(RESULTS / "determinism_default.json"),
            "--repo-id",
            "requant-demo/default-w8a8-pow2",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (out / "README.md").read_bytes() == EXAMPLE.read_bytes()
    card = ModelCard(EXAMPLE.read_text())
    assert card.data.license == "apache-2.0"  # carried from requant/data/default/README.md
    assert "deterministic" in card.data.tags and "power-of-two-scales" in card.data.tags
