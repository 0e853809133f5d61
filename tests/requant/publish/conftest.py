"""Reports for the card and push tests.

`micro_reported`: real reports, made by the real `requant eval` and `requant determinism`
commands (the typer app, as a user runs them) on the micro Qwen3 and its nearest conversion.
`eval_report` / `determinism_report`: hand-written reports with fixed, round numbers (for
exact formatting checks), holding a subset of the real reports' keys (test_card checks that
they stay a subset)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


def eval_report(digest: str | None) -> dict:
    rep = {
        "arms": {
            "native": {
                "word_perplexity": 71.92,
                "byte_perplexity": 2.2231,
                "bits_per_byte": 1.1526,
                "delta_pct": None,
                "ci90": None,
            },
            "nearest": {
                "word_perplexity": 72.01,
                "byte_perplexity": 2.2236,
                "bits_per_byte": 1.1529,
                "delta_pct": 0.125,
                "ci90": [0.031, 0.219],
            },
            "ceiling": {
                "word_perplexity": 71.90,
                "byte_perplexity": 2.2230,
                "bits_per_byte": 1.1525,
                "delta_pct": -0.028,
                "ci90": [-0.11, 0.05],
            },
            "probe": {
                "word_perplexity": 95.5,
                "byte_perplexity": 2.41,
                "bits_per_byte": 1.27,
                "delta_pct": 32.78,
                "ci90": [30.1, 35.6],
            },
        },
        "documents": 50,
        "bootstrap": {"replicates": 2000, "seed": 0},
        "decomposition": {"probe_mismatch_share": 0.9962},
        "lm_eval_version": "0.4.13",
        "backend": "reference",
    }
    if digest is not None:
        rep["manifest_digest"] = digest
    return rep


def determinism_report(digest: str | None) -> dict:
    def prompt(same, first):
        return {
            "identical": same,
            "first_divergence": first,
            "sha256": {"cutlass": "a" * 64, "triton": ("a" if same else "b") * 64},
        }

    rep = {
        "regimes": {
            "native": {
                "identical": 5,
                "total": 8,
                "prompts": [prompt(True, None)] * 5 + [prompt(False, 17), prompt(False, 3), prompt(False, 40)],
            },
            "pow2": {"identical": 8, "total": 8, "prompts": [prompt(True, None)] * 8},
        },
        "backends": ["cutlass", "triton"],
    }
    if digest is not None:
        rep["manifest_digest"] = digest
    return rep


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1))
    return path


@pytest.fixture(scope="session")
def micro_reported(tmp_path_factory) -> Path:
    """The micro Qwen3 W8A8 (tests/requant/conftest.py's MICRO, seed 1) converted with
    --arm nearest, and beside the conversion the reports of the real commands:
    requant-eval.json from `requant eval MICRO --arms native,nearest,probe --limit 1` (of the
    source: tied by SHA256SUMS.source) and requant-determinism.json from `requant
    determinism POW2 --backends reference --prompts 1 --new-tokens 3` (of these bytes).
    Offline, one torch thread (as the commands default to on a CPU). Read-only: copy it."""
    import torch
    from typer.testing import CliRunner

    from requant.checkpoint.synthetic import generate
    from requant.cli import app
    from requant.convert import convert

    from ..conftest import MICRO

    root = tmp_path_factory.mktemp("reported")
    micro = generate(MICRO, root / "micro", seed=1)
    pow2 = root / "pow2"
    convert(micro, pow2, "nearest")
    runner = CliRunner()
    n = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_CACHE", str(root / "hf-datasets-cache"))
        try:
            for args in (
                [
                    "eval",
                    micro,
                    "--arms",
                    "native,nearest,probe",
                    "--limit",
                    1,
                    "--bootstrap",
                    100,
                    "--json",
                    pow2 / "requant-eval.json",
                ],
                [
                    "determinism",
                    pow2,
                    "--backends",
                    "reference",
                    "--prompts",
                    1,
                    "--new-tokens",
                    3,
                    "--json",
                    pow2 / "requant-determinism.json",
                ],
            ):
                res = runner.invoke(app, [str(a) for a in args])
                assert res.exit_code == 0, res.output
        finally:
            torch.set_num_threads(n)
    shutil.rmtree(root / "hf-datasets-cache", ignore_errors=True)
    return pow2
