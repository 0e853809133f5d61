"""training/package_default.py on the tiny CPU run: requant accepts the W8A8 checkpoint, its
non-quantized tensors are the bf16 source's bytes, its Linears are llm-compressor's RTN, the
real `requant convert --source ... --arm unconstrained` reproduces it byte for byte,
packaging twice gives the same bytes, and bad input changes nothing.
Independent references: the bytes on disk (read back with the safetensors library), a
float32 re-statement of the RTN arithmetic, the CLI run as a subprocess, and transformers'
from_pretrained for the bf16 checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from requant.checkpoint import open_checkpoint
from training import arch, package_default
from training.train_tokenizer import TOKENIZER_DIR

from .conftest import tree_bytes

ROOT = Path(__file__).resolve().parents[2]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_w8a8_checkpoint_is_accepted_and_rtn(tiny_package, tiny_run):
    ck = open_checkpoint(tiny_package / "default")
    p = arch.TINY
    assert len(ck.quantized_linears) == 7 * p.layers
    qc = ck.config["quantization_config"]
    assert (
        qc["ignore"] == ["lm_head"] and qc["format"] == "int-quantized" and qc["quant_method"] == "compressed-tensors"
    )
    assert "lm_head.weight" not in ck.tensor_names() and ck.config["tie_word_embeddings"] is True
    trained = _tensors(tiny_run / "model.safetensors")
    for lin in ck.quantized_linears:
        q, s = ck.weight_and_scale(lin)
        w = trained[lin + ".weight"]
        # RTN restated in float32: scale = bf16(absmax / 127.5); q = rint(clamp(bf16(w / scale)))
        absmax = w.float().abs().amax(dim=1, keepdim=True)
        s_ref = (absmax / 127.5).to(torch.bfloat16)
        q_ref = torch.round(torch.clamp((w.float() / s_ref.float()).to(torch.bfloat16).float(), -128, 127)).to(
            torch.int8
        )
        assert torch.equal(_bits(s), _bits(s_ref)) and torch.equal(q, q_ref), lin
    with safe_open(str(tiny_package / "default" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_unquantized_tensors_are_the_source_bytes(tiny_package, tiny_run):
    w8a8 = _tensors(tiny_package / "default" / "model.safetensors")
    bf16 = _tensors(tiny_package / "default-bf16" / "model.safetensors")
    trained = _tensors(tiny_run / "model.safetensors")
    assert set(bf16) == set(trained)
    for name, t in trained.items():
        assert torch.equal(_bits(bf16[name]), _bits(t)), name  # the bf16 checkpoint is the trained weights
        if name.endswith("_proj.weight"):
            assert (
                w8a8[name].dtype == torch.int8
                and w8a8[name.replace(".weight", ".weight_scale")].dtype == torch.bfloat16
            )
        else:
            assert w8a8[name].dtype == torch.bfloat16 and torch.equal(_bits(w8a8[name]), _bits(t)), name
    assert set(w8a8) == set(trained) | {n + "_scale" for n in trained if n.endswith("_proj.weight")}
    # and the tokenizer files are the committed ones, in both checkpoints
    for d in ("default", "default-bf16"):
        for f in package_default.TOKENIZER_FILES:
            assert (tiny_package / d / f).read_bytes() == (TOKENIZER_DIR / f).read_bytes()


def test_cli_convert_from_source_reproduces_it(tiny_package, tmp_path):
    out = tmp_path / "reproduced"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "requant.cli",
            "convert",
            str(tiny_package / "default"),
            "-o",
            str(out),
            "--source",
            str(tiny_package / "default-bf16"),
            "--arm",
            "unconstrained",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert tree_bytes(out) == tree_bytes(tiny_package / "default")


def test_packaging_is_deterministic_and_reports_sizes(tiny_package, tiny_run, tmp_path, capsys):
    assert package_default.main([str(tiny_run), "--out-dir", str(tmp_path / "again")]) == 0
    table = capsys.readouterr().out
    assert tree_bytes(tmp_path / "again") == tree_bytes(tiny_package)
    total = sum(len(b) for b in tree_bytes(tiny_package).values())
    assert f"**{total:,}**" in table and "default/model.safetensors" in table
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["default", "default-bf16"]  # no temp left


def test_bf16_checkpoint_loads_in_transformers(tiny_package):
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(tiny_package / "default-bf16"))
    assert model.config.rope_parameters["rope_theta"] == 1e6 and model.config.tie_word_embeddings
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_package / "default-bf16"))
    ids = tok("It is a truth universally acknowledged", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_existing_output_needs_force(tiny_run, tmp_path, capsys):
    out = tmp_path / "data"
    (out / "default").mkdir(parents=True)
    (out / "default" / "keep").write_text("old")
    assert package_default.main([str(tiny_run), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "pass --force" in err and "\n" not in err
    assert sorted(p.name for p in out.iterdir()) == ["default"] and (out / "default" / "keep").read_text() == "old"
    assert package_default.main([str(tiny_run), "--out-dir", str(out), "--force"]) == 0
    assert (
        sorted(p.name for p in out.iterdir()) == ["default", "default-bf16"] and not (out / "default" / "keep").exists()
    )


@pytest.mark.parametrize(
    "damage,message",
    [
        ("drop", "tensor model.layers.1.mlp.down_proj.weight is missing"),
        ("dtype", "tensor model.norm.weight is torch.float32, expected torch.bfloat16"),
        ("extra", "unexpected tensor lm_head.weight"),
        ("config", "field 'hidden_act' is 'gelu', expected 'silu'"),
        ("shape", "tensor model.embed_tokens.weight has shape [8192, 64], expected [8192, 128]"),
    ],
)
def test_bad_training_output_is_one_line_and_writes_nothing(tiny_run, tmp_path, capsys, damage, message):
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(tiny_run, bad)
    t = _tensors(bad / "model.safetensors")
    if damage == "drop":
        del t["model.layers.1.mlp.down_proj.weight"]
    elif damage == "dtype":
        t["model.norm.weight"] = t["model.norm.weight"].float()
    elif damage == "extra":
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    else:
        cfg = json.loads((bad / "config.json").read_text())
        if damage == "config":
            cfg["hidden_act"] = "gelu"
        else:
            cfg["hidden_size"] = 128
        (bad / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    before = tree_bytes(bad)
    out = tmp_path / "data"
    assert package_default.main([str(bad), "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert str(bad) in err  # names the file
    assert not out.exists() or list(out.iterdir()) == []
    assert tree_bytes(bad) == before  # input untouched
