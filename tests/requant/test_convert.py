"""requant.convert end to end on small checkpoints written under tmp_path.

References: the input files themselves (unconstrained must reproduce them byte for byte),
safetensors.torch.load_file for reading values independently of our reader, and
requant.arms.requantize (property-tested against Fractions in test_arms.py) for the
expected requantized tensors."""

import json
import shutil

import pytest
import torch

import requant.arms
from kernels.bf16 import is_power_of_two
from requant.arms import requantize
from requant.checkpoint import open_checkpoint
from requant.convert import PROVENANCE_KEY, convert
from requant.errors import OutputError
from requant.synthetic import generate

from .conftest import MICRO, leftovers, load_all, tree_bytes, write_custom


def _all_tensors(ckpt_dir):
    out = {}
    for p in sorted(ckpt_dir.glob("*.safetensors")):
        out.update(load_all(p))
    return out


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("fixture", ["default_copy", "micro", "micro_sharded"])
def test_unconstrained_reproduces_every_file(request, tmp_path, fixture):
    src = request.getfixturevalue(fixture)
    (src / "tokenizer.json").write_text('{"byte-level": true}')
    (src / "extra").mkdir()
    (src / "extra" / "notes.txt").write_bytes(b"\x00\x01 kept as is")
    out = tmp_path / "out"
    res = convert(src, out, "unconstrained")
    assert tree_bytes(out) == tree_bytes(src)
    assert res.totals()["scales_changed"] == 0
    if fixture == "micro_sharded":
        assert len(list(src.glob("model-*.safetensors"))) > 2


@pytest.mark.parametrize("arm", ["nearest", "ceiling", "mse", "probe"])
@pytest.mark.parametrize("fixture", ["micro", "micro_sharded"])
def test_constrained_arms(request, tmp_path, fixture, arm):
    src = request.getfixturevalue(fixture)
    out = tmp_path / "out"
    res = convert(src, out, arm)
    before, after = _all_tensors(src), _all_tensors(out)
    ck = open_checkpoint(out)
    assert set(before) == set(after)
    for lin in ck.quantized_linears:
        q, s = before[lin + ".weight"], before[lin + ".weight_scale"]
        q2, s2 = requantize(q, s, arm)
        assert _same_bits(after[lin + ".weight"], q2)
        assert _same_bits(after[lin + ".weight_scale"], s2)
        assert bool(is_power_of_two(after[lin + ".weight_scale"]).all())
    quant = {lin + sfx for lin in ck.quantized_linears for sfx in (".weight", ".weight_scale")}
    for name in set(before) - quant:
        assert _same_bits(after[name], before[name]), name
    # headers (and so the index) unchanged, byte for byte
    for p in src.glob("*.safetensors"):
        n = int.from_bytes(p.read_bytes()[:8], "little")
        assert (out / p.name).read_bytes()[: 8 + n] == p.read_bytes()[: 8 + n]
    if (src / "model.safetensors.index.json").exists():
        assert (out / "model.safetensors.index.json").read_bytes() == (src / "model.safetensors.index.json").read_bytes()
    cfg_in, cfg_out = json.loads((src / "config.json").read_text()), json.loads((out / "config.json").read_text())
    prov = cfg_out.pop(PROVENANCE_KEY)
    assert cfg_out == cfg_in  # quantization_config untouched
    assert prov["arm"] == arm and prov["servable"] == (arm != "probe")
    assert prov["source"]["digest"].startswith("sha256:") and prov["version"]
    assert ("warning" in prov) == (arm == "probe")
    assert list(res.layers) == ck.quantized_linears
    if arm == "ceiling":
        assert res.totals()["weights_clipped"] == 0


def test_unusual_header_layout_round_trips(tmp_path, micro):
    """Header keys unsorted, data in another order, metadata last, odd padding: the
    unconstrained output is still the same bytes, and a constrained one keeps the header."""
    tensors = load_all(micro / "model.safetensors")
    names = sorted(tensors)
    src = tmp_path / "odd"
    shutil.copytree(micro, src)
    write_custom(src / "model.safetensors", tensors, header_order=names[::-1], data_order=names,
                 metadata={"format": "pt", "note": "hand made"}, metadata_last=True, pad=13)
    convert(src, tmp_path / "u", "unconstrained")
    assert tree_bytes(tmp_path / "u") == tree_bytes(src)
    convert(src, tmp_path / "n", "nearest")
    raw_in, raw_out = (src / "model.safetensors").read_bytes(), (tmp_path / "n" / "model.safetensors").read_bytes()
    n = int.from_bytes(raw_in[:8], "little")
    assert raw_out[: 8 + n] == raw_in[: 8 + n] and len(raw_out) == len(raw_in)
    after = load_all(tmp_path / "n" / "model.safetensors")
    lin = "model.layers.1.mlp.down_proj"
    q2, s2 = requantize(tensors[lin + ".weight"], tensors[lin + ".weight_scale"], "nearest")
    assert _same_bits(after[lin + ".weight"], q2) and _same_bits(after[lin + ".weight_scale"], s2)


def test_weight_and_scale_in_different_shards(tmp_path, micro):
    """Scales in shard 1, weights in shard 2; the same result with 1 or 2 workers."""
    tensors = load_all(micro / "model.safetensors")
    src = tmp_path / "split"
    src.mkdir()
    shutil.copy(micro / "config.json", src / "config.json")
    a = {n: t for n, t in tensors.items() if n.endswith("_scale") or "norm" in n}
    b = {n: t for n, t in tensors.items() if n not in a}
    from safetensors.torch import save_file

    save_file(a, str(src / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(b, str(src / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    wm = {n: "model-00001-of-00002.safetensors" for n in a} | {n: "model-00002-of-00002.safetensors" for n in b}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}, indent=2))
    convert(src, tmp_path / "j1", "nearest", jobs=1)
    convert(src, tmp_path / "j2", "nearest", jobs=2)
    assert tree_bytes(tmp_path / "j1") == tree_bytes(tmp_path / "j2")
    after = _all_tensors(tmp_path / "j1")
    for lin in open_checkpoint(src).quantized_linears:
        q2, s2 = requantize(tensors[lin + ".weight"], tensors[lin + ".weight_scale"], "nearest")
        assert _same_bits(after[lin + ".weight"], q2) and _same_bits(after[lin + ".weight_scale"], s2)
    convert(src, tmp_path / "u", "unconstrained")
    assert tree_bytes(tmp_path / "u") == tree_bytes(src)


def test_sharding_does_not_change_tensors(tmp_path, micro, micro_sharded):
    """Same seed, different sharding: the same tensors (generator draws in model order)."""
    one, many = _all_tensors(micro), _all_tensors(micro_sharded)
    assert set(one) == set(many) and all(_same_bits(one[n], many[n]) for n in one)


def test_converting_twice_is_stable(tmp_path, micro):
    convert(micro, tmp_path / "a", "nearest")
    convert(tmp_path / "a", tmp_path / "b", "nearest")
    ta, tb = _all_tensors(tmp_path / "a"), _all_tensors(tmp_path / "b")
    assert all(_same_bits(ta[n], tb[n]) for n in ta)
    prov = json.loads((tmp_path / "b" / "config.json").read_text())[PROVENANCE_KEY]
    assert prov["source"]["requant"]["arm"] == "nearest"  # the chain is recorded


def test_deterministic_digest_and_bytes(tmp_path, micro):
    r1 = convert(micro, tmp_path / "a", "mse")
    r2 = convert(micro, tmp_path / "b", "mse")
    assert r1.source_digest == r2.source_digest
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")


def test_existing_output_needs_force(tmp_path, micro):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="--force"):
        convert(micro, out, "nearest")
    assert (out / "keep.txt").exists()
    convert(micro, out, "nearest", force=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert leftovers(tmp_path, "out") == ["out"]


def test_never_writes_inside_source(tmp_path, micro):
    before = tree_bytes(micro)
    for bad in (micro, micro / "sub", micro / "a" / "b"):
        with pytest.raises(OutputError, match="inside the source"):
            convert(micro, bad, "nearest", force=True)
    with pytest.raises(OutputError, match="contains the source"):
        convert(micro, tmp_path, "nearest", force=True)
    assert tree_bytes(micro) == before


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
@pytest.mark.parametrize("fixture", ["micro", "micro_sharded"])
def test_interrupted_convert_leaves_nothing(request, tmp_path, monkeypatch, fixture, exc):
    src = request.getfixturevalue(fixture)
    real = requant.arms.Requantizer.finish
    calls = []

    def flaky(self):
        calls.append(1)
        if len(calls) == 5:  # half way through the 14 Linears
            raise exc
        return real(self)

    monkeypatch.setattr(requant.arms.Requantizer, "finish", flaky)
    parent = tmp_path / "outs"
    with pytest.raises(type(exc)):
        convert(src, parent / "out", "nearest")
    assert not parent.exists() or leftovers(parent, "out") == []


def test_interrupted_force_keeps_the_old_output(tmp_path, monkeypatch, micro):
    out = tmp_path / "out"
    convert(micro, out, "ceiling")
    before = tree_bytes(out)

    def boom(self, *a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(requant.arms.Requantizer, "rows", boom)
    with pytest.raises(RuntimeError):
        convert(micro, out, "nearest", force=True)
    assert tree_bytes(out) == before
    assert leftovers(tmp_path, "out") == ["out"]


def test_source_unconstrained_reproduces_rtn_checkpoint(tmp_path):
    """--source with llm-compressor's RTN arithmetic gives back the RTN-made bytes."""
    src = generate(MICRO, tmp_path / "w8a8", seed=3, keep_source=tmp_path / "bf16")
    convert(src, tmp_path / "again", "unconstrained", source=tmp_path / "bf16")
    assert tree_bytes(tmp_path / "again") == tree_bytes(src)
    res = convert(src, tmp_path / "ceil", "ceiling", source=tmp_path / "bf16")
    assert res.totals()["weights_clipped"] <= res.totals()["channels"]  # at most a channel maximum each
    prov = json.loads((tmp_path / "ceil" / "config.json").read_text())[PROVENANCE_KEY]
    assert prov["source"]["bf16_weights"] == str(tmp_path / "bf16")
    ck = open_checkpoint(tmp_path / "ceil")
    for lin in ck.quantized_linears:
        assert bool(is_power_of_two(ck.weight_and_scale(lin)[1]).all())


def test_mse_costs_less_than_nearest_and_ceiling(tmp_path, default_copy):
    errs = {arm: convert(default_copy, tmp_path / arm, arm).totals()["rel_weight_error"] for arm in ("nearest", "ceiling", "mse")}
    assert errs["mse"] <= errs["ceiling"] <= errs["nearest"]


def test_fp32_scales(tmp_path, micro):
    """fp32 scales (24-bit mantissas: the float64 path) convert exactly and stay fp32."""
    from requant.safetensors_io import library_order, write_file

    tensors = load_all(micro / "model.safetensors")
    for n in list(tensors):
        if n.endswith("weight_scale"):
            # an fp32 scale with a full 24-bit mantissa
            tensors[n] = tensors[n].float() * (1 + 2.0**-20)
    write_file(micro / "model.safetensors", [(n, tensors[n]) for n in library_order(tensors)], {"format": "pt"})
    convert(micro, tmp_path / "out", "nearest")
    after = load_all(tmp_path / "out" / "model.safetensors")
    for lin in open_checkpoint(micro).quantized_linears:
        q2, s2 = requantize(tensors[lin + ".weight"], tensors[lin + ".weight_scale"], "nearest")
        assert after[lin + ".weight_scale"].dtype == torch.float32
        assert _same_bits(after[lin + ".weight"], q2) and _same_bits(after[lin + ".weight_scale"], s2)
    convert(micro, tmp_path / "u", "unconstrained")
    assert tree_bytes(tmp_path / "u") == tree_bytes(micro)


def test_source_sharded(tmp_path):
    """--source with sharded originals (and a sharded W8A8 checkpoint) reproduces the RTN bytes."""
    src = generate(MICRO, tmp_path / "w8a8", seed=4, shard_size=4096, keep_source=tmp_path / "bf16")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    convert(src, tmp_path / "again", "unconstrained", source=tmp_path / "bf16", jobs=2)
    assert tree_bytes(tmp_path / "again") == tree_bytes(src)
    res = convert(src, tmp_path / "mse", "mse", source=tmp_path / "bf16")
    res_ceil = convert(src, tmp_path / "ceil", "ceiling", source=tmp_path / "bf16")
    assert res.totals()["rel_weight_error"] <= res_ceil.totals()["rel_weight_error"]
