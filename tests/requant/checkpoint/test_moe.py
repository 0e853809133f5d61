"""Qwen3-MoE checkpoints: opened, converted (every arm, streaming), verified, and refused with
one line naming the field or tensor when malformed.

References: the files themselves (unconstrained and --source must reproduce them byte for
byte), safetensors.torch (an independent reader) for the tensors, requant.scales.arms.requantize
(property-tested against Fractions in tests/requant/scales/test_arms.py) for the requantized
expert tensors, and the config's numbers for the expected layout."""

import json

import pytest
import torch
from safetensors.torch import save_file

from requant.checkpoint import open_checkpoint
from requant.checkpoint.synthetic import generate
from requant.convert import convert
from requant.errors import LayoutError, SchemeError, TensorError
from requant.scales.arms import requantize
from tests.requant.conftest import load_all, tree_bytes


@pytest.fixture
def moe(tmp_path):
    return generate("tiny-moe", tmp_path / "moe", seed=3)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_tiny_moe_layout(moe):
    cfg = json.loads((moe / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    e, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    assert cfg["num_hidden_layers"] == 2
    assert (e, k, cfg["mlp_only_layers"], cfg["decoder_sparse_step"], cfg["norm_topk_prob"]) == (8, 2, [0], 1, True)
    assert cfg["quantization_config"]["ignore"] == ["lm_head", "re:.*mlp.gate$"]
    ck = open_checkpoint(moe)
    # layer 0 dense (mlp_only_layers): 4 attention + 3 MLP Linears; layer 1: 4 attention + 8 experts x 3
    assert len(ck.quantized_linears) == 7 + 4 + e * 3
    tensors = load_all(moe / "model.safetensors")
    router = tensors["model.layers.1.mlp.gate.weight"]
    assert router.dtype == torch.bfloat16 and tuple(router.shape) == (e, cfg["hidden_size"])
    assert "model.layers.1.mlp.gate" not in ck.quantized_linears and "model.layers.0.mlp.gate.weight" not in tensors
    for i in range(e):
        w = tensors[f"model.layers.1.mlp.experts.{i}.down_proj.weight"]
        s = tensors[f"model.layers.1.mlp.experts.{i}.down_proj.weight_scale"]
        assert w.dtype == torch.int8 and tuple(w.shape) == (cfg["hidden_size"], cfg["moe_intermediate_size"])
        assert s.dtype == torch.bfloat16 and tuple(s.shape) == (cfg["hidden_size"], 1)
    assert tensors["lm_head.weight"].dtype == torch.bfloat16


def test_round_trips_byte_exact(tmp_path):
    """unconstrained reproduces every file (one shard and several); --source (the bf16 original)
    re-quantized by RTN reproduces the checkpoint."""
    src = generate("tiny-moe", tmp_path / "s", seed=5, shard_size=100_000, keep_source=tmp_path / "bf16")
    assert len(list(src.glob("model-*.safetensors"))) > 3
    convert(src, tmp_path / "u", "unconstrained")
    assert tree_bytes(tmp_path / "u") == tree_bytes(src)
    convert(src, tmp_path / "r", "unconstrained", source=tmp_path / "bf16")
    got = tree_bytes(tmp_path / "r")
    assert {n: b for n, b in got.items() if n.endswith((".safetensors", ".index.json"))} == {
        n: b for n, b in tree_bytes(src).items() if n.endswith((".safetensors", ".index.json"))
    }


@pytest.mark.parametrize("arm", ["nearest", "ceiling", "mse", "probe"])
def test_constrained_arms_keep_router_and_head(tmp_path, moe, arm):
    convert(moe, tmp_path / "o", arm)
    before, after = load_all(moe / "model.safetensors"), load_all(tmp_path / "o" / "model.safetensors")
    ck = open_checkpoint(tmp_path / "o")
    quant = set()
    for lin in ck.quantized_linears:
        q2, s2 = requantize(before[lin + ".weight"], before[lin + ".weight_scale"], arm)
        assert _same_bits(after[lin + ".weight"], q2) and _same_bits(after[lin + ".weight_scale"], s2), lin
        quant |= {lin + ".weight", lin + ".weight_scale"}
    assert sum(".experts." in n for n in ck.quantized_linears) == 8 * 3
    kept = set(before) - quant
    assert {"lm_head.weight", "model.layers.1.mlp.gate.weight"} <= kept
    for name in kept:
        assert _same_bits(after[name], before[name]), name


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is more than num_experts 8"),
        ({"num_experts": None}, "lacks 'num_experts'"),
        ({"num_experts": 0}, "num_experts is 0"),
        ({"num_local_experts": 4}, "num_experts 8 and num_local_experts 4 disagree"),
        ({"moe_intermediate_size": None}, "lacks 'moe_intermediate_size'"),
        ({"mlp_only_layers": [2]}, "mlp_only_layers names layer 2, outside 0..1"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob is 'yes'"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step is 0"),
        ({"model_type": "qwen3"}, "model_type is \"qwen3\"; requant supports 'qwen3_moe' (Qwen3MoeForCausalLM)"),
    ],
)
def test_malformed_config_is_one_line(moe, changes, words):
    _edit_config(moe, **changes)
    with pytest.raises(SchemeError) as e:
        open_checkpoint(moe)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and str(moe / "config.json") in msg


def test_transformers5_num_local_experts_is_accepted(moe):
    _edit_config(moe, num_experts=None, num_local_experts=8)
    assert len(open_checkpoint(moe).quantized_linears) == 35


def _rewrite(path, edit):
    t = load_all(path / "model.safetensors")
    edit(t)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})


def _drop(*names):
    def edit(t):
        for n in names:
            del t[n]

    return edit


def _set(name, value):
    def edit(t):
        t[name] = value

    return edit


def _add_linear(module, out, inp):
    """A quantized Linear the layout does not allow (int8 weight and its bf16 scale)."""

    def edit(t):
        t[module + ".weight"] = torch.ones(out, inp, dtype=torch.int8)
        t[module + ".weight_scale"] = torch.full((out, 1), 2.0**-7, dtype=torch.bfloat16)

    return edit


E = "model.layers.1.mlp.experts."
CASES = [
    (_drop(E + "5.up_proj.weight", E + "5.up_proj.weight_scale"), LayoutError, E + "5.up_proj.weight", "missing an expert Linear of layer 1"),
    (_drop("model.layers.1.mlp.gate.weight"), LayoutError, "model.layers.1.mlp.gate.weight", "missing the router of layer 1"),
    (_add_linear(E + "8.up_proj", 768, 256), TensorError, E + "8.up_proj.weight", "expert 8, but config.json has num_experts 8"),
    (_set(E + "2.gate_proj.weight", torch.zeros(768, 64, dtype=torch.int8)), TensorError, E + "2.gate_proj.weight", "shape [768, 64], but config.json"),
    (_set("model.layers.1.mlp.gate.weight", torch.zeros(7, 256, dtype=torch.bfloat16)), TensorError, "model.layers.1.mlp.gate.weight", "shape [7, 256], but config.json"),
    (_add_linear("model.layers.0.mlp.experts.0.up_proj", 64, 128), TensorError, "model.layers.0.mlp.experts.0.up_proj.weight", "layer 0 is dense (in mlp_only_layers)"),
    (_add_linear("model.layers.1.mlp.up_proj", 768, 256), TensorError, "model.layers.1.mlp.up_proj.weight", "layer 1 is sparse (experts) in config.json, but holds a dense MLP"),
]  # fmt: skip


@pytest.mark.parametrize("edit, error, tensor, words", CASES)
def test_malformed_tensors_are_one_line(moe, edit, error, tensor, words):
    _rewrite(moe, edit)
    with pytest.raises(error) as e:
        open_checkpoint(moe)
    msg = str(e.value)
    assert e.value.tensor.removesuffix("_scale") == tensor and words in msg and "\n" not in msg, msg


def test_router_stored_bf16_must_be_ignored(moe):
    cfg = json.loads((moe / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ["lm_head"]
    (moe / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TensorError) as e:
        open_checkpoint(moe)
    assert e.value.tensor == "model.layers.1.mlp.gate.weight" and "does not ignore it" in str(e.value)


def test_inspect_names_the_experts(moe):
    from requant.checkpoint.inspect import inspect_checkpoint

    info = inspect_checkpoint(moe)
    # one sparse layer (layer 1) of 8 experts, 3 Linears each; the router kept in bf16 (ignored)
    assert info["moe"] == {
        "sparse_layers": 1,
        "experts": 8,
        "experts_per_token": 2,
        "expert_linears": 24,
        "routers": ["BF16"],
    }
    assert info["config"]["num_experts"] == 8 and info["config"]["mlp_only_layers"] == [0]


@pytest.mark.parametrize(
    "preset, total, active, linears",
    # published parameter counts: Qwen3-30B-A3B 30.5B total, 3.3B active; Qwen3-235B-A22B 235B, 22B
    [("qwen3-30b-a3b", 30.5e9, 3.3e9, 48 * (4 + 128 * 3)), ("qwen3-235b-a22b", 235e9, 22e9, 94 * (4 + 128 * 3))],
)
def test_large_presets_match_the_published_sizes(preset, total, active, linears, capsys):
    """The plan (nothing written): parameters from the bf16 bytes within 1% of the published totals;
    active parameters (embeddings, attention, routers, norms, 8 experts per layer, head) within 5%."""
    from requant.checkpoint.synthetic import PRESETS, main

    assert main([preset, "--plan"]) == 0
    got = json.loads(capsys.readouterr().out)
    p = PRESETS[preset]
    assert got["quantized_linears"] == linears and got["expert_linears"] == p.layers * 128 * 3
    params = got["bf16_bytes"] / 2
    assert abs(params / total - 1) < 0.01
    per_expert = 3 * p.hidden * p.moe_intermediate
    act = params - p.layers * (p.experts - p.top_k) * per_expert
    assert abs(act / active - 1) < 0.05, act


def test_card_of_a_converted_moe_checkpoint(tmp_path, moe):
    """`requant card` renders for a converted MoE checkpoint; its facts row names the experts."""
    from tests.requant.commands.cli import invoke

    convert(moe, tmp_path / "o", "nearest")
    res = invoke("card", tmp_path / "o", "--stdout")
    assert res.exit_code == 0, res.output
    assert (
        "| architecture | Qwen3-MoE (`Qwen3MoeForCausalLM`): 8 experts in each of 1 sparse layers, top 2; "
        "the routers (`mlp.gate`) unquantized, copied byte for byte |" in res.stdout
    )
    # output channels: attention 2 x (256 + 128 + 128 + 256), layer 0's MLP 768 + 768 + 256, 8 experts x (768 + 768 + 256)
    assert "| power-of-two weight scales | 17,664 of 17,664 |" in res.stdout


def test_quantized_router_is_read_and_converted_but_not_run(tmp_path, moe):
    """A checkpoint whose config does not ignore the router and stores it W8A8 is a valid
    compressed-tensors checkpoint: opened, inspected, converted; the runtime, which routes with the
    bf16 weight, refuses it in one line."""
    from requant.checkpoint.inspect import inspect_checkpoint
    from requant.runtime import load_model

    cfg = json.loads((moe / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ["lm_head"]
    (moe / "config.json").write_text(json.dumps(cfg))
    r = "model.layers.1.mlp.gate"
    _rewrite(moe, _drop(r + ".weight"))
    _rewrite(moe, _add_linear(r, 8, 256))
    ck = open_checkpoint(moe)
    assert r in ck.quantized_linears and inspect_checkpoint(moe)["moe"]["routers"] == ["int8"]
    convert(moe, tmp_path / "o", "nearest")
    with pytest.raises(ValueError, match="the router 'model.layers.1.mlp.gate' is quantized"):
        load_model(tmp_path / "o")
