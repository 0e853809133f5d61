"""--source must prove it is the checkpoint's origin (requant.evidence.origin), or be refused.

Checkpoints are built here from a true bf16 origin with requant.checkpoint.synthetic's pieces (plan,
rtn_quantize, model_config) the way llm-compressor's recipes would: SmoothQuant-style (a
per-channel vector folded into the norms, the next Linears' columns divided by it, then
RTN), GPTQ-style (RTN's scale, int8 weights moved by +-1 by error feedback along each row)
and plain RTN. References: the construction itself (which tensor was changed first, and
where), the int8 bytes on disk compared with numpy, and for the accepted case the input
files (byte for byte)."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from requant.checkpoint.synthetic import generate, model_config, plan, write_json
from requant.cli import app
from requant.convert import convert
from requant.errors import TensorError
from requant.scales.from_source import rtn_quantize

from ..conftest import MICRO, load_all, tree_bytes

runner = CliRunner()
INSTEAD = "requantize from its int8 weights instead (drop --source)"


@pytest.fixture
def origin(tmp_path):
    """(RTN checkpoint, its bf16 origin), both single-file."""
    ckpt = generate(MICRO, tmp_path / "rtn", seed=5, keep_source=tmp_path / "bf16")
    return ckpt, tmp_path / "bf16"


def _linears():
    return [name for name, kind, _ in plan(MICRO) if kind == "linear"]


def _write_checkpoint(dst, weights: dict, quantize=rtn_quantize):
    """A W8A8 checkpoint of `weights` (bf16 tensors by name): every Linear of the plan
    quantized by `quantize` (-> q, scale), everything else passed through; written with
    the safetensors library and the real compressed-tensors config, as requant.checkpoint.synthetic
    writes checkpoints."""
    dst.mkdir()
    tensors = {}
    for name, kind, _ in plan(MICRO):
        if kind == "linear":
            q, s = quantize(weights[name + ".weight"])
            tensors[name + ".weight"], tensors[name + ".weight_scale"] = q, s
        else:
            tensors[name] = weights[name]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    write_json(dst / "config.json", model_config(MICRO, quantized=True))
    return dst


def _smoothing_vector(seed: int, n: int) -> torch.Tensor:
    """Per-channel factors 2^u, u uniform in [-1, 1], as SmoothQuant's max-ratio vectors look."""
    g = torch.Generator().manual_seed(seed)
    return torch.pow(2.0, torch.rand(n, generator=g) * 2 - 1)


def _refused(tmp_path, ckpt, source, tensor, *needles):
    """convert refuses with one TensorError naming `tensor` and the needles, writes nothing,
    and leaves both inputs as they were; the CLI says it in one line and exits 1."""
    before = tree_bytes(ckpt), tree_bytes(source)
    parent = tmp_path / "outs"
    with pytest.raises(TensorError) as ei:
        convert(ckpt, parent / "out", "unconstrained", source=source)
    msg = str(ei.value)
    assert ei.value.tensor == tensor, msg
    for needle in needles + (INSTEAD,):
        assert needle in msg, msg
    assert not parent.exists()  # nothing written, not even OUT's parent
    res = runner.invoke(
        app, ["convert", str(ckpt), "--source", str(source), "-o", str(parent / "out"), "--arm", "nearest"]
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output and tensor in lines[0] and needles[0] in lines[0], (
        res.output
    )
    assert not parent.exists()
    assert (tree_bytes(ckpt), tree_bytes(source)) == before
    return msg


def test_smoothquant_checkpoint_is_refused(tmp_path, origin):
    """Norms multiplied by a smoothing vector, the next Linears' input columns divided by
    it, then RTN: the first tensor that disagrees in model order is layer 0's input norm."""
    _, bf16 = origin
    orig = load_all(bf16 / "model.safetensors")
    smoothed = dict(orig)
    for i in range(MICRO.layers):
        pre = f"model.layers.{i}."
        for norm, leaves, seed in (
            ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), 2 * i),
            ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), 2 * i + 1),
        ):
            v = _smoothing_vector(seed, MICRO.hidden)
            smoothed[pre + norm + ".weight"] = (orig[pre + norm + ".weight"].float() * v).to(torch.bfloat16)
            for leaf in leaves:
                smoothed[pre + leaf + ".weight"] = (orig[pre + leaf + ".weight"].float() / v).to(torch.bfloat16)
    ckpt = _write_checkpoint(tmp_path / "smoothquant", smoothed)
    msg = _refused(
        tmp_path,
        ckpt,
        bf16,
        "model.layers.0.input_layernorm.weight",
        "differs from the source",
        "the checkpoint was smoothed (SmoothQuant?)",
    )
    # the first differing element of the norm is named (the construction: norm 1.0 times v)
    v0 = _smoothing_vector(0, MICRO.hidden)
    k = int(((orig["model.layers.0.input_layernorm.weight"].float() * v0).to(torch.bfloat16) != 1).nonzero()[0, 0])
    assert f"at element {k} " in msg


def test_smoothing_folded_into_a_linear_is_refused_at_its_scale(tmp_path, origin):
    """Smoothing between v_proj and o_proj (v_proj's rows times the vector, o_proj's
    columns divided): the norms are untouched, and layer 0's v_proj scale is the first
    tensor that disagrees, at the first channel whose factor changes its RTN scale."""
    _, bf16 = origin
    orig = load_all(bf16 / "model.safetensors")
    w = dict(orig)
    v = torch.pow(2.0, torch.tensor([0.0] * 3 + [1.0] + [0.5] * (MICRO.kv_heads * MICRO.head_dim - 4)))
    pre = "model.layers.0.self_attn."
    w[pre + "v_proj.weight"] = (orig[pre + "v_proj.weight"].float() * v[:, None]).to(torch.bfloat16)
    ckpt = _write_checkpoint(tmp_path / "smooth_vo", w)
    msg = _refused(
        tmp_path,
        ckpt,
        bf16,
        pre + "v_proj.weight_scale",
        "is not the RTN scale of the source weight",
        "output channel 3 ",
    )
    assert "smoothed, or another observer?" in msg


def _error_feedback(w: torch.Tensor):
    """GPTQ-style int8 weights: RTN's scale, rows quantized left to right with each
    rounding error carried into the next column (float64; w / s is exact there)."""
    _, s = rtn_quantize(w)
    x = w.double() / s.double()
    q = torch.empty(w.shape, dtype=torch.int8)
    err = torch.zeros(w.shape[0], dtype=torch.float64)
    for j in range(w.shape[1]):
        t = x[:, j] + err
        qj = torch.round(t).clamp(-128, 127)
        err = t - qj
        q[:, j] = qj.to(torch.int8)
    return q, s


def test_gptq_checkpoint_is_refused(tmp_path, origin):
    """Error-feedback int8 weights at RTN's scale: refused at the first Linear in model
    order, naming its first differing element and the count (reference: numpy on the int8
    bytes of this checkpoint and of the RTN checkpoint made from the same origin)."""
    rtn, bf16 = origin
    ckpt = _write_checkpoint(tmp_path / "gptq", load_all(bf16 / "model.safetensors"), quantize=_error_feedback)
    first = _linears()[0] + ".weight"
    q_gptq = load_all(ckpt / "model.safetensors")[first].numpy()
    q_rtn = load_all(rtn / "model.safetensors")[first].numpy()
    diff = q_gptq.astype(np.int16) - q_rtn
    assert np.abs(diff).max() == 1  # the construction: +-1 moves
    r, c = np.argwhere(diff != 0)[0]
    msg = _refused(
        tmp_path, ckpt, bf16, first, "int8 weights are not RTN of the source at the checkpoint's scale (GPTQ?)"
    )
    assert (
        f"first difference at [{r}, {c}], {q_gptq[r, c]} here, RTN gives {q_rtn[r, c]} ({np.count_nonzero(diff)} of {diff.size} weights differ;"
        in msg
    )


def test_one_moved_weight_is_found(tmp_path, origin):
    """A single int8 weight moved by one, in the last Linear: named with its position."""
    rtn, bf16 = origin
    tensors = load_all(rtn / "model.safetensors")
    last = _linears()[-1] + ".weight"
    q = tensors[last]
    q[7, 3] = q[7, 3] + (1 if int(q[7, 3]) < 127 else -1)
    ckpt = tmp_path / "moved"
    shutil.copytree(rtn, ckpt)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    msg = _refused(tmp_path, ckpt, bf16, last, "int8 weights are not RTN")
    assert f"first difference at [7, 3], {int(q[7, 3])} here" in msg and f"(1 of {q.numel()} weights differ;" in msg


def test_another_models_weights_are_refused(tmp_path, origin):
    """A bf16 model of the same shapes but another seed: the embedding (first in model
    order) differs, and the message does not guess at smoothing."""
    rtn, _ = origin
    generate(MICRO, tmp_path / "other_q", seed=6, keep_source=tmp_path / "other_bf16")
    msg = _refused(
        tmp_path,
        rtn,
        tmp_path / "other_bf16",
        "model.embed_tokens.weight",
        "differs from the source",
        "the source is not the checkpoint's origin",
    )
    assert "SmoothQuant" not in msg


def test_missing_or_retyped_passthrough_tensor_is_refused(tmp_path, origin):
    rtn, bf16 = origin
    orig = load_all(bf16 / "model.safetensors")
    src = tmp_path / "src_missing"
    shutil.copytree(bf16, src)
    save_file(
        {k: v for k, v in orig.items() if k != "model.norm.weight"},
        str(src / "model.safetensors"),
        metadata={"format": "pt"},
    )
    _refused(tmp_path, rtn, src, "model.norm.weight", "not in the source weights")
    src2 = tmp_path / "src_f32"
    shutil.copytree(bf16, src2)
    save_file(
        {k: (v.float() if k == "lm_head.weight" else v) for k, v in orig.items()},
        str(src2 / "model.safetensors"),
        metadata={"format": "pt"},
    )
    _refused(tmp_path, rtn, src2, "lm_head.weight", "is BF16 [64, 32] here but F32 [64, 32] in the source")


def test_rtn_checkpoint_is_accepted_and_reproduced(tmp_path):
    """The true RTN origin passes the proof: --arm unconstrained gives back the
    checkpoint byte for byte (sharded, through the CLI too), and nearest converts."""
    ckpt = generate(MICRO, tmp_path / "rtn", seed=7, shard_size=4096, keep_source=tmp_path / "bf16")
    res = runner.invoke(
        app,
        [
            "convert",
            str(ckpt),
            "--source",
            str(tmp_path / "bf16"),
            "-o",
            str(tmp_path / "again"),
            "--arm",
            "unconstrained",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert tree_bytes(tmp_path / "again") == tree_bytes(ckpt)
    convert(ckpt, tmp_path / "near", "nearest", source=tmp_path / "bf16", jobs=2)
    assert json.loads((tmp_path / "near" / "config.json").read_text())["requant"]["bf16_source"] == str(
        tmp_path / "bf16"
    )


def test_fp32_scales_made_from_bf16_rtn_are_accepted(tmp_path, origin):
    """A checkpoint whose RTN scales were stored upcast to fp32 is still RTN of the bf16
    origin (the scale check casts the RTN scale to the checkpoint's dtype): accepted, and
    unconstrained reproduces it byte for byte."""
    rtn, bf16 = origin
    tensors = {k: (v.float() if k.endswith("_scale") else v) for k, v in load_all(rtn / "model.safetensors").items()}
    ckpt = tmp_path / "fp32"
    shutil.copytree(rtn, ckpt)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    convert(ckpt, tmp_path / "again", "unconstrained", source=bf16)
    assert tree_bytes(tmp_path / "again") == tree_bytes(ckpt)


def test_streamed_blocks_find_the_same_first_difference(tmp_path, origin, monkeypatch):
    """Blocks of one row (far smaller than a Linear) and 2-byte pass-through pieces: the
    proof still accepts the origin and names the same element of a moved weight."""
    import requant.evidence.origin

    monkeypatch.setattr(requant.evidence.origin, "BLOCK_BYTES", 1)
    monkeypatch.setattr(requant.evidence.origin, "CHUNK", 2)
    rtn, bf16 = origin
    convert(rtn, tmp_path / "ok", "unconstrained", source=bf16)
    assert tree_bytes(tmp_path / "ok") == tree_bytes(rtn)
    tensors = load_all(rtn / "model.safetensors")
    name = _linears()[3] + ".weight"
    tensors[name][5, 0] = tensors[name][5, 0] + (1 if int(tensors[name][5, 0]) < 127 else -1)
    tensors[name][9, 2] = tensors[name][9, 2] + (1 if int(tensors[name][9, 2]) < 127 else -1)
    ckpt = tmp_path / "moved"
    shutil.copytree(rtn, ckpt)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    msg = _refused(tmp_path, ckpt, bf16, name, "int8 weights are not RTN")
    assert "first difference at [5, 0]" in msg and f"(2 of {tensors[name].numel()} weights differ;" in msg
