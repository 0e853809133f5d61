"""`requant audit` on a Qwen3-MoE checkpoint (tiny-moe): each expert is audited on the operands
of the tokens the router sent it, in prefill and decode, and an expert that received none is named
and left out of every count.

Reference for which experts receive no token: the router's tie rule (docs/moe.md), made to decide
by construction: experts 5, 6 and 7 get expert 0's router row, so their probability always equals
expert 0's and a stable descending sort ranks them after it, 0 < 5 < 6 < 7; with top 2 experts, 6
and 7 can never be chosen (two of the tied group, 0 and 5, always come first), while 5 can. The
per-layer rows and the scorecard are the audit's own (its tests live beside this one)."""

import json

import torch
from safetensors.torch import save_file

from requant.checkpoint.synthetic import generate
from tests.requant.commands.cli import invoke
from tests.requant.conftest import load_all


def test_audit_names_experts_without_tokens(tmp_path):
    ck = generate("tiny-moe", tmp_path / "m", seed=6)
    t = load_all(ck / "model.safetensors")
    r = "model.layers.1.mlp.gate.weight"
    for e in (5, 6, 7):
        t[r][e] = t[r][0]
    save_file(t, str(ck / "model.safetensors"), metadata={"format": "pt"})
    res = invoke(
        "audit", ck, "--prompts", 4, "--decode-tokens", 2, "--json", tmp_path / "a.json", "--report", tmp_path / "rep"
    )
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "a.json").read_text())
    idle = [f"model.layers.1.mlp.experts.{e}.{leaf}" for e in (6, 7) for leaf in ("gate_proj", "up_proj", "down_proj")]
    assert out["experts_without_tokens"] == {"native": idle, "pow2": idle}
    for regime in ("native", "pow2"):
        assert out["decode"]["experts_without_tokens"][regime]["experts"][-6:] == idle
        rows = [row for row in out["per_layer"] if row["regime"] == regime]
        assert len(rows) == 35 - 6 and not {row["name"] for row in rows} & set(idle)
        assert sum(row["m"] for row in rows if row["name"].endswith("experts.5.gate_proj")) > 0
    assert out["per_layer_summary"]["pow2"] == {**out["per_layer_summary"]["pow2"], "layers": 29, "bitwise_equal": 29}
    assert out["scorecard"]["false_positives"] == out["scorecard"]["false_negatives"] == 0
    assert out["decode"]["scorecard"]["false_positives"] == out["decode"]["scorecard"]["false_negatives"] == 0
    line = "experts without tokens, prefill, native (not audited): 6 Linears, model.layers.1.mlp.experts.{6,7}.{gate_proj,up_proj,down_proj}"
    assert line in res.output and f"- {line}\n" in (tmp_path / "rep" / "audit.md").read_text()
    # expert operands: the down_proj rows of the routed experts add up to tokens x top_k
    downs = [row["m"] for row in out["per_layer"] if row["regime"] == "native" and row["name"].endswith("down_proj")]
    assert sum(downs[1:]) == out["tokens"] * 2 and torch.tensor(downs).min() > 0


def test_plan_counts_every_expert_linear():
    """`audit --plan` from the qwen3-30b-a3b config alone: 48 layers x (4 attention + 128 experts x 3)
    Linears, 42 cells each (21 variants x 2 regimes); the routers ignored; shapes from the config."""
    from requant.audit.suite import plan_from_config
    from requant.checkpoint.synthetic import PRESETS, model_config

    plan = plan_from_config(model_config(PRESETS["qwen3-30b-a3b"], quantized=True))
    assert plan["layers"] == 48 * (4 + 128 * 3) and plan["cells"] == plan["layers"] * 42
    shapes = {(s["out"], s["in"]): s["count"] for s in plan["shapes"]}
    assert shapes == {(4096, 2048): 48, (512, 2048): 96, (2048, 4096): 48, (768, 2048): 48 * 256, (2048, 768): 48 * 128}
    assert not any(n.endswith("mlp.gate") for n in plan["linears"])
