"""requant.checkpoint.synthetic and the embedded default: the default is the packaged trained model, the presets are the real Qwen3
configs, and the files look like llm-compressor's. References: the committed files in
requant/data/default (byte for byte), and an independent float32 re-statement of the RTN
arithmetic (torch's bf16 ops compute in fp32 and round once to bf16)."""

import json
import subprocess
import sys

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, data_path
from requant.checkpoint import open_checkpoint
from requant.checkpoint.synthetic import PRESETS, generate, plan
from requant.io.safetensors_io import read_header
from requant.models.qwen3 import SIZE_KEYS
from requant.scales.from_source import rtn_quantize
from tests.requant.conftest import tree_bytes


def test_default_is_the_packaged_trained_model(tmp_path):
    """The embedded default is exactly what training/package_default.py makes of the shipped
    bf16 weights, and those weights are the ones the H200 training run reported. References:
    the committed bytes of requant/data/{default,default-bf16}, and the weights sha256 recorded
    in benchmarks/results/train_default/summary.json by the GPU run (two runs, identical)."""
    import hashlib
    from pathlib import Path

    from training import package_default

    bf16 = DEFAULT_CHECKPOINT.parent / "default-bf16"
    out = tmp_path / "data"
    assert package_default.main([str(bf16), "--out-dir", str(out)]) == 0
    assert tree_bytes(out / "default") == tree_bytes(DEFAULT_CHECKPOINT)
    assert tree_bytes(out / "default-bf16") == tree_bytes(bf16)
    summary = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "train_default" / "summary.json"
    for run in (summary, summary.with_name("summary_run2.json")):
        trained = json.loads(run.read_text())["weights_sha256"]
        assert hashlib.sha256((bf16 / "model.safetensors").read_bytes()).hexdigest() == trained
    assert data_path() == DEFAULT_CHECKPOINT


def test_generator_module_equals_the_api(tmp_path):
    """`python -m requant.checkpoint.synthetic tiny` writes what generate('tiny') writes (reference: the
    API's files, byte for byte)."""
    subprocess.run(
        [sys.executable, "-m", "requant.checkpoint.synthetic", "tiny", str(tmp_path / "m"), "--seed", "0"],
        check=True,
        capture_output=True,
    )
    assert tree_bytes(tmp_path / "m") == tree_bytes(generate("tiny", tmp_path / "api"))


def test_generator_layers_cuts_the_preset(tmp_path):
    """`--layers 1` writes what generate() writes for the preset with one layer (reference: the API's
    files from dataclasses.replace, byte for byte); outside 1..layers it is refused, nothing written."""
    import dataclasses

    cmd = [sys.executable, "-m", "requant.checkpoint.synthetic", "tiny-moe", str(tmp_path / "m"), "--layers", "1"]
    subprocess.run(cmd, check=True, capture_output=True)
    one = dataclasses.replace(PRESETS["tiny-moe"], layers=1)
    assert tree_bytes(tmp_path / "m") == tree_bytes(generate(one, tmp_path / "api"))
    assert open_checkpoint(tmp_path / "m").config["num_hidden_layers"] == 1
    for bad in ("0", str(PRESETS["tiny-moe"].layers + 1)):
        r = subprocess.run([*cmd[:4], str(tmp_path / "x"), "--layers", bad], capture_output=True, text=True)
        assert r.returncode == 2 and "--layers must be 1 to" in r.stderr and not (tmp_path / "x").exists()


DIMS = (*SIZE_KEYS, "tie_word_embeddings")  # the config keys the runtime reads (requant.models.qwen3)


def _dims(cfg: dict) -> tuple:
    return tuple(cfg[k] for k in DIMS)


def test_tiny_preset_is_a_sensible_qwen3(tmp_path):
    """The random tiny preset (the old embedded default, kept for fast scale tests)."""
    ck = open_checkpoint(generate("tiny", tmp_path / "tiny"))
    cfg = ck.config
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert _dims(cfg) == (256, 768, 4, 4, 2, 64, 512, False)
    qc = cfg["quantization_config"]
    assert (
        qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized" and qc["ignore"] == ["lm_head"]
    )
    assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert len(ck.quantized_linears) == 28
    f = read_header(ck.path / "model.safetensors")
    assert f.metadata == {"format": "pt"}
    for lin in ck.quantized_linears:
        q, s = ck.weight_and_scale(lin)
        assert all(d % 16 == 0 for d in q.shape)
        assert s.dtype == torch.bfloat16 and s.shape == (q.shape[0], 1)
    # -128 appears (absmax / 127.5), and the norms / embeddings are usable
    assert any(bool((ck.weight_and_scale(lin)[0] == -128).any()) for lin in ck.quantized_linears)
    emb = ck.tensor("model.embed_tokens.weight").float()
    assert 0.015 < float(emb.std()) < 0.025 and bool(torch.isfinite(emb).all())
    assert bool((ck.tensor("model.norm.weight") == 1).all())
    assert ck.tensor("lm_head.weight").dtype == torch.bfloat16
    # outlier channels: a wide spread of scales within a layer
    s = ck.weight_and_scale("model.layers.0.mlp.gate_proj")[1].float()
    assert float(s.max() / s.median()) > 3


def test_default_is_the_trained_qwen3():
    """The embedded default: the trained 6-layer Qwen3 (training/arch.py), W8A8 by RTN, tied
    embeddings, with its tokenizer."""
    ck = open_checkpoint(DEFAULT_CHECKPOINT)
    cfg = ck.config
    assert _dims(cfg) == (256, 768, 6, 4, 2, 64, 8192, True)
    assert len(ck.quantized_linears) == 42 and "lm_head.weight" not in ck.tensor_names()
    assert (DEFAULT_CHECKPOINT / "tokenizer.json").is_file()
    assert any(bool((ck.weight_and_scale(lin)[0] == -128).any()) for lin in ck.quantized_linears)
    assert not bool((ck.tensor("model.norm.weight") == 1).all())  # trained, not initialised


@pytest.mark.parametrize(
    "preset,linears,tied", [("qwen3-1.7b", 196, True), ("qwen3-8b", 252, False), ("qwen3-14b", 280, False)]
)
def test_presets_are_the_real_configs(preset, linears, tied):
    p = PRESETS[preset]
    entries = plan(p)
    assert sum(1 for _, kind, _ in entries if kind == "linear") == linears
    assert p.tie == tied and (("lm_head.weight", "head", (p.vocab, p.hidden)) in entries) == (not tied)
    assert p.head_dim == 128 and p.kv_heads == 8 and p.vocab == 151936
    shapes = p.layer_linear_shapes()
    assert shapes["self_attn.q_proj"] == (p.heads * 128, p.hidden) and shapes["mlp.down_proj"] == (
        p.hidden,
        p.intermediate,
    )
    assert {"qwen3-1.7b": (2048, 6144, 28, 16), "qwen3-8b": (4096, 12288, 36, 32), "qwen3-14b": (5120, 17408, 40, 40)}[
        preset
    ] == (p.hidden, p.intermediate, p.layers, p.heads)


def test_rtn_matches_float32_restatement():
    """scale = bf16(fp32(absmax) / 127.5); q = rint(clamp(bf16(fp32(w) / fp32(scale))))."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(64, 48, generator=g) * 0.02).to(torch.bfloat16)
    w[3, 5] = -w[3].abs().max() * 2  # negative maximum: maps to -128
    q, s = rtn_quantize(w)
    absmax = w.float().abs().amax(dim=1, keepdim=True)
    s_ref = (absmax / 127.5).to(torch.bfloat16)
    x = (w.float() / s_ref.float()).to(torch.bfloat16).float()
    q_ref = torch.round(x.clamp(-128, 127)).to(torch.int8)
    assert torch.equal(s.view(torch.int16), s_ref.view(torch.int16)) and torch.equal(q, q_ref)
    assert int(q[3, 5]) == -128


def test_keep_source_writes_bf16_originals(tmp_path):
    from tests.requant.conftest import MICRO

    generate(MICRO, tmp_path / "q", keep_source=tmp_path / "src")
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    assert "quantization_config" not in cfg
    f = read_header(tmp_path / "src" / "model.safetensors")
    assert f.info("model.layers.0.self_attn.q_proj.weight").dtype == "BF16"
    assert not any(n.endswith("_scale") for n in f.tensors)
