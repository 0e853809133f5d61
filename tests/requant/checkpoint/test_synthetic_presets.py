"""The qwen3-0.6b and qwen3-32b presets: their config.json (requant.checkpoint.synthetic.model_config) read back
by requant.qwen3.Qwen3Arch and planned by `requant audit --plan`. Independent reference: the
published Qwen3-0.6B and Qwen3-32B configs (hidden, intermediate, layers, heads, KV heads, head_dim,
vocab, tied embeddings) and the count 7 quantized Linears per decoder layer."""

import json

from typer.testing import CliRunner

from requant.audit.suite import plan_from_config
from requant.checkpoint.synthetic import PRESETS, model_config, write_json
from requant.models.qwen3 import Qwen3Arch

PUBLISHED = {  # hidden, intermediate, layers, heads, kv heads, head_dim, vocab, tied
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True),
    "qwen3-32b": (5120, 25600, 64, 64, 8, 128, 151936, False),
}


def test_presets_match_the_published_configs():
    for name, want in PUBLISHED.items():
        arch = Qwen3Arch.from_config(model_config(PRESETS[name], quantized=True))
        got = (arch.hidden, arch.intermediate, arch.layers, arch.heads, arch.kv_heads, arch.head_dim, arch.vocab)
        assert got + (arch.tie,) == want


def test_plan_for_the_new_presets(tmp_path):
    import typer

    from requant.commands.audit import audit

    app = typer.Typer(add_completion=False)
    app.command("audit")(audit)
    app.command("other")(lambda: None)
    for name, layers in (("qwen3-0.6b", 28), ("qwen3-32b", 64)):
        d = tmp_path / name
        d.mkdir()
        write_json(d / "config.json", model_config(PRESETS[name], quantized=True))
        plan = plan_from_config(json.loads((d / "config.json").read_text()))
        assert plan["layers"] == 7 * layers and plan["cells"] == 7 * layers * 42
        res = CliRunner().invoke(app, ["audit", str(d), "--plan", "--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
        assert f"layers: {7 * layers}" in res.stdout
        assert json.loads((tmp_path / f"{name}.json").read_text())["cells"] == 7 * layers * 42
