"""Every bad input is refused with a message naming the file (and the tensor), by
open_checkpoint, by convert (leaving no output behind) and by the CLI (non-zero exit, no
traceback). Reference for what is valid: the unmodified micro checkpoint, which passes."""

import json
import struct

import pytest
import torch
from typer.testing import CliRunner

from requant.checkpoint import open_checkpoint
from requant.convert import convert
from requant.errors import CheckpointError, SchemeError
from requant.io.safetensors_io import read_header, write_file
from tests.requant.conftest import leftovers, load_all

F = "model.safetensors"
LIN = "model.layers.1.mlp.up_proj"


def _header(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _rewrite(path, header, data):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _set_scale(src, value):
    f = read_header(src / F)
    info = f.info(LIN + ".weight_scale")
    raw = bytearray((src / F).read_bytes())
    pos = f.data_start + info.begin + 2 * 3  # output channel 3
    raw[pos : pos + 2] = torch.tensor([value], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    (src / F).write_bytes(bytes(raw))


def truncated(src):
    raw = (src / F).read_bytes()
    (src / F).write_bytes(raw[: len(raw) // 2])
    return F, "truncated"


def header_past_end(src):
    raw = bytearray((src / F).read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) + 100)
    (src / F).write_bytes(bytes(raw))
    return F, "past the end"


def header_not_json(src):
    raw = bytearray((src / F).read_bytes())
    raw[8 + 10 : 8 + 20] = b"#" * 10
    (src / F).write_bytes(bytes(raw))
    return F, "not valid JSON"


def overlapping(src):
    h, data = _header(src / F)
    e = h[LIN + ".weight"]["data_offsets"]
    h[LIN + ".weight"]["data_offsets"] = [e[0] - 1, e[1] - 1]
    _rewrite(src / F, h, data)
    return F, "overlap"


def gapped(src):
    h, data = _header(src / F)
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    last = names[-1]
    b, e = h[last]["data_offsets"]
    h[last]["data_offsets"] = [b + 4, e + 4]
    _rewrite(src / F, h, data + b"\0" * 4)
    return F, "gap"


def scale_nan(src):
    _set_scale(src, float("nan"))
    return F, "NaN scale"


def scale_zero(src):
    _set_scale(src, 0.0)
    return F, "zero scale"


def scale_negative(src):
    _set_scale(src, -0.01)
    return F, "negative scale"


def scale_inf(src):
    _set_scale(src, float("inf"))
    return F, "infinite scale"


def scale_shape(src):
    h, data = _header(src / F)
    out = h[LIN + ".weight_scale"]["shape"][0]
    h[LIN + ".weight_scale"]["shape"] = [out // 2, 2]
    _rewrite(src / F, h, data)
    return F, "does not match weight"


def weight_not_int8(src):
    t = load_all(src / F)
    t[LIN + ".weight"] = t[LIN + ".weight"].to(torch.bfloat16)
    write_file(src / F, sorted(t.items()), {"format": "pt"})
    return F, "stored as BF16, expected I8"


def weight_uint8(src):
    h, data = _header(src / F)
    h[LIN + ".weight"]["dtype"] = "U8"
    _rewrite(src / F, h, data)
    return F, "stored as U8, expected I8"


def linear_without_scale(src):
    t = load_all(src / F)
    del t[LIN + ".weight_scale"]
    write_file(src / F, sorted(t.items()), {"format": "pt"})
    return F, "without a weight_scale"


def zero_point(src):
    t = load_all(src / F)
    t[LIN + ".weight_zero_point"] = torch.zeros(t[LIN + ".weight_scale"].shape, dtype=torch.int8)
    write_file(src / F, sorted(t.items()), {"format": "pt"})
    return F, "zero point"


def missing_config(src):
    (src / "config.json").unlink()
    return "config.json", "missing config.json"


def missing_weights(src):
    (src / F).unlink()
    return str(src), "no weights"


CASES = [
    truncated,
    header_past_end,
    header_not_json,
    overlapping,
    gapped,
    scale_nan,
    scale_zero,
    scale_negative,
    scale_inf,
    scale_shape,
    weight_not_int8,
    weight_uint8,
    linear_without_scale,
    zero_point,
    missing_config,
    missing_weights,
]
TENSOR_NAMED = {
    overlapping,
    scale_nan,
    scale_zero,
    scale_negative,
    scale_inf,
    scale_shape,
    weight_not_int8,
    weight_uint8,
    linear_without_scale,
    zero_point,
}


def _check_refused(src, tmp_path, file, needle, tensor=None):
    with pytest.raises(CheckpointError) as ei:
        open_checkpoint(src)
    msg = str(ei.value)
    assert needle in msg and file in msg, msg
    if tensor:
        assert tensor in msg, msg
    out_parent = tmp_path / "outs"
    with pytest.raises(CheckpointError):
        convert(src, out_parent / "out", "nearest")
    assert not out_parent.exists() or leftovers(out_parent, "out") == []
    return msg


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_single_file_cases(tmp_path, micro, case):
    file, needle = case(micro)
    _check_refused(micro, tmp_path, file, needle, LIN if case in TENSOR_NAMED else None)


def test_index_names_missing_shard(tmp_path, micro_sharded):
    shard = sorted(micro_sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    _check_refused(micro_sharded, tmp_path, "model.safetensors.index.json", f"{shard.name!r}, which does not exist")


@pytest.mark.parametrize(
    "evil", ["../evil.safetensors", "/etc/passwd.safetensors", "sub/x.safetensors", "..", "a\\b.safetensors"]
)
def test_index_path_traversal(tmp_path, micro_sharded, evil):
    (tmp_path / "evil.safetensors").write_bytes(b"")
    idx = micro_sharded / "model.safetensors.index.json"
    index = json.loads(idx.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = evil
    idx.write_text(json.dumps(index))
    _check_refused(micro_sharded, tmp_path, "model.safetensors.index.json", "path traversal")


def test_index_disagrees_with_shard(tmp_path, micro_sharded):
    idx = micro_sharded / "model.safetensors.index.json"
    index = json.loads(idx.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[1]
    idx.write_text(json.dumps(index))
    _check_refused(micro_sharded, tmp_path, "model.safetensors.index.json", "does not hold it", name)


def _cfg_edit(path, fn):
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def _w(cfg):
    return cfg["quantization_config"]["config_groups"]["group_0"]["weights"]


def _a(cfg):
    return cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"]


SCHEMES = {
    "asymmetric": (lambda c: _w(c).update(symmetric=False), "weights.symmetric"),
    "group": (lambda c: _w(c).update(strategy="group", group_size=128), "weights.strategy"),
    "tensor": (lambda c: _w(c).update(strategy="tensor"), "weights.strategy"),
    "4-bit": (lambda c: _w(c).update(num_bits=4), "weights.num_bits"),
    "static-activations": (lambda c: _a(c).update(dynamic=False), "input_activations.dynamic"),
    "per-tensor-activations": (lambda c: _a(c).update(strategy="tensor"), "input_activations.strategy"),
    "fp8": (lambda c: (_w(c).update(type="float"), _a(c).update(type="float")), "weights.type"),
    "fp8-format": (lambda c: c["quantization_config"].update(format="float-quantized"), "quantization_config.format"),
    "gptq": (lambda c: c["quantization_config"].update(quant_method="gptq"), "quantization_config.quant_method"),
    "no-activations": (
        lambda c: c["quantization_config"]["config_groups"]["group_0"].update(input_activations=None),
        "input_activations is missing",
    ),
    "kv-cache": (lambda c: c["quantization_config"].update(kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
    "not-quantized": (lambda c: c.pop("quantization_config"), "no quantization_config"),
    "bits-as-bool": (lambda c: _w(c).update(num_bits=True), "weights.num_bits"),
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_scheme_refused_naming_the_field(tmp_path, micro, name):
    fn, field = SCHEMES[name]
    _cfg_edit(micro, fn)
    with pytest.raises(SchemeError) as ei:
        open_checkpoint(micro)
    assert field in str(ei.value) and "config.json" in str(ei.value)


def test_config_not_json(tmp_path, micro):
    (micro / "config.json").write_text("{oops")
    _check_refused(micro, tmp_path, "config.json", "not valid JSON")


def test_unquantized_linear_not_ignored(tmp_path, micro):
    t = load_all(micro / F)
    t[LIN + ".weight"] = (t[LIN + ".weight"].float() * t.pop(LIN + ".weight_scale").float()).to(torch.bfloat16)
    write_file(micro / F, sorted(t.items()), {"format": "pt"})
    _check_refused(micro, tmp_path, F, "does not ignore it", LIN)


@pytest.mark.parametrize("case", [truncated, scale_nan, missing_config], ids=lambda c: c.__name__)
def test_cli_reports_without_traceback(tmp_path, micro, case):
    from tests.requant.commands.test_checkpoint import app

    file, needle = case(micro)
    res = CliRunner().invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "Traceback" not in res.output and needle in res.output and "error" in res.output
    assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(app, ["inspect", str(micro)])
    assert res.exit_code == 2 and needle in res.output
