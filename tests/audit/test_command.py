"""requant/commands/audit.py through typer's CliRunner (a private app with the same function that
cli.py registers). --plan is checked against the Qwen3-1.7B config (196 Linears, 8,232
cells); the full run against the scorecard and the report files."""

import json

import typer
from typer.testing import CliRunner

from requant.commands.audit import audit

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("audit")(audit)
app.command("noop")(lambda: None)  # two commands: "audit" stays a sub-command, as in cli.py
runner = CliRunner()

QWEN3_1_7B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "quantization_config": {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"]},
}


def test_plan_from_a_qwen3_1_7b_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1_7B))
    res = runner.invoke(app, ["audit", str(tmp_path), "--plan", "--json", str(tmp_path / "plan.json")])
    assert res.exit_code == 0, res.output
    assert "cells: 8232" in res.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["cells"] == 8232 and plan["layers"] == 196
    assert {(s["out"], s["in"]): s["count"] for s in plan["shapes"]} == {
        (2048, 2048): 56,
        (1024, 2048): 56,
        (6144, 2048): 56,
        (2048, 6144): 28,
    }


def test_plan_of_the_default_and_a_quantized_lm_head(tmp_path):
    res = runner.invoke(app, ["audit", "--plan"])
    assert res.exit_code == 0 and "cells: 1764" in res.output
    cfg = dict(QWEN3_1_7B, quantization_config={"ignore": []})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = runner.invoke(app, ["audit", str(tmp_path / "config.json"), "--plan"])
    assert res.exit_code == 0 and "cells: 8274" in res.output  # 197 Linears


def test_errors_are_messages_not_tracebacks(tmp_path):
    res = runner.invoke(app, ["audit", "--backends", "reference-triton-order", "--prompts", "1"])
    assert res.exit_code == 2 and "two comma-separated" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["audit", "--backends", "cutlass,triton", "--device", "cpu", "--prompts", "1"])
    assert res.exit_code == 2 and "GPU" in res.output
    res = runner.invoke(app, ["audit", str(tmp_path / "nothing-here"), "--prompts", "1"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    res = runner.invoke(app, ["audit", "--prompts", "99"])
    assert res.exit_code == 2 and "--prompts" in res.output


def test_full_run_writes_the_report(tmp_path):
    out = tmp_path / "rep"
    res = runner.invoke(
        app,
        [
            "audit",
            "--backends",
            "reference",
            "--prompts",
            "1",
            "--decode-tokens",
            "1",
            "--report",
            str(out),
            "--json",
            str(tmp_path / "a.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} == {"audit.json", "audit.md", "detection_heatmap.png", "ulp_histograms.png"}
    data = json.loads((tmp_path / "a.json").read_text())
    assert (
        data["cells"] == 1764
        and data["scorecard"]["false_positives"] == 0
        and data["scorecard"]["false_negatives"] == 0
    )
    assert (out / "detection_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "audit.md").read_text()
    assert data["scorecard"]["matrix_sha256"] in md and "pow2: 42/42 layers bitwise equal" in md
    assert data["decode"]["cells"] == 1764 * 2 and "## Decode beside prefill" in md


def test_a_checkpoint_the_runtime_cannot_run_is_refused(tmp_path):
    """A valid W8A8 checkpoint without Qwen3's q_norm is refused with a message
    (requant.checkpoint.synthetic writes the checkpoint; the tensor is dropped with safetensors)."""
    from safetensors.torch import load_file, save_file

    from requant.checkpoint.synthetic import generate

    src = generate("tiny", tmp_path / "ck")
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.0.self_attn.q_norm.weight"]
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    res = runner.invoke(app, ["audit", str(src), "--prompts", "1"])
    assert res.exit_code == 2 and "q_norm" in res.output and "Traceback" not in res.output


def test_an_unknown_or_cpu_triton_activation_quantizer_is_refused(tmp_path, monkeypatch):
    """REQUANT_AUDIT_ACT (audit/suite.py, the quantizer A/B): anything but reference/triton, or
    triton without CUDA, exits 2 with one line naming the variable; nothing is written."""
    from requant.audit.suite import ACT_ENV

    out = tmp_path / "a.json"
    for value, words in [("fast", [ACT_ENV, "'fast'", "reference"]), ("triton", [ACT_ENV, "CUDA"])]:
        monkeypatch.setenv(ACT_ENV, value)
        res = runner.invoke(app, ["audit", "--prompts", "1", "--device", "cpu", "--json", str(out)])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
        assert all(w in line for w in words), line
        assert not out.exists()
