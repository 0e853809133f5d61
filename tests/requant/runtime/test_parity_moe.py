"""The Qwen3-MoE reference engine against transformers' Qwen3MoeForCausalLM on the same weights.

Reference: transformers' own Qwen3-MoE (5.x) loading the tiny-moe preset's bf16 originals (written
by requant.checkpoint.synthetic --keep-source: one Linear per expert on disk, which transformers fuses
on load) in float32, "eager" attention. requant runs the same directory (every Linear dense, the
bf16 regime). Compared as tests/requant/runtime/test_parity.py does, with its yardstick (transformers'
bf16 model against the same fp32 reference) and thresholds. Where requant's router differs on
purpose (fp32 logits, fixed-order sums, ties to the lowest id: docs/moe.md), a token near a routing
tie may take another expert than transformers' bf16 model; the thresholds measure the whole effect.
"""

import pytest
import torch

from requant.checkpoint.synthetic import generate
from requant.runtime import load_model
from tests.requant.runtime.test_parity import check_four_prompts

transformers = pytest.importorskip("transformers")


def test_bf16_moe_directory_matches_transformers(tmp_path):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = tmp_path / "bf16"
        generate("tiny-moe", tmp_path / "q", seed=4, keep_source=src)
        model = load_model(src)
        assert model.regime == "bf16" and model.engine == "reference"
        ref32, ref16 = (
            transformers.Qwen3MoeForCausalLM.from_pretrained(src, dtype=dt, attn_implementation="eager").eval()
            for dt in (torch.float32, torch.bfloat16)
        )
        check_four_prompts(model, ref32, ref16, "MoE bf16 directory, 4 prompts")
    finally:
        torch.set_num_threads(n)
