"""Reports written by hand from the key lists of issue 8 (sections 3 and 4), for the card.

`requant eval` and `requant determinism` are built elsewhere; these fixtures hold exactly the
keys the issue names (plus manifest_digest, which issue 9 adds to every report)."""

from __future__ import annotations

import json
from pathlib import Path


def eval_report(digest: str | None) -> dict:
    rep = {
        "arms": {
            "native": {"word_perplexity": 71.92, "byte_perplexity": 2.2231, "bits_per_byte": 1.1526, "delta_pct": None, "ci90": None},
            "nearest": {"word_perplexity": 72.01, "byte_perplexity": 2.2236, "bits_per_byte": 1.1529, "delta_pct": 0.125, "ci90": [0.031, 0.219]},
            "ceiling": {"word_perplexity": 71.90, "byte_perplexity": 2.2230, "bits_per_byte": 1.1525, "delta_pct": -0.028, "ci90": [-0.11, 0.05]},
            "probe": {"word_perplexity": 95.5, "byte_perplexity": 2.41, "bits_per_byte": 1.27, "delta_pct": 32.78, "ci90": [30.1, 35.6]},
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
        return {"identical": same, "first_divergence": first, "sha256": {"cutlass": "a" * 64, "triton": ("a" if same else "b") * 64}}

    rep = {"regimes": {"native": {"identical": 5, "total": 8, "prompts": [prompt(True, None)] * 5 + [prompt(False, 17), prompt(False, 3), prompt(False, 40)]},
                       "pow2": {"identical": 8, "total": 8, "prompts": [prompt(True, None)] * 8}},
           "backends": ["cutlass", "triton"]}
    if digest is not None:
        rep["manifest_digest"] = digest
    return rep


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1))
    return path
