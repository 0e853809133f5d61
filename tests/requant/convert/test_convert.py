"""requant.convert end to end on small checkpoints written under tmp_path.

References: the input files themselves (unconstrained must reproduce them byte for byte),
safetensors.torch.load_file for reading values independently of our reader, and
requant.scales.arms.requantize (property-tested against Fractions in test_arms.py) for the
expected requantized tensors."""

import hashlib
import json
import shutil

import pytest
import torch

import requant.scales.arms
from requant.checkpoint import open_checkpoint
from requant.checkpoint.synthetic import generate
from requant.convert import PROVENANCE_KEY, convert
from requant.errors import OutputError
from requant.kernels.bf16 import is_power_of_two
from requant.scales.arms import requantize
from tests.requant.conftest import MICRO, leftovers, load_all, tree_bytes, write_custom


def _all_tensors(ckpt_dir):
    out = {}
    for p in sorted(ckpt_dir.glob("*.safetensors")):
        out.update(load_all(p))
    return out


def _same_bits(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


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
        assert (out / "model.safetensors.index.json").read_bytes() == (
            src / "model.safetensors.index.json"
        ).read_bytes()
    cfg_in, cfg_out = json.loads((src / "config.json").read_text()), json.loads((out / "config.json").read_text())
    prov = cfg_out.pop(PROVENANCE_KEY)
    assert cfg_out == cfg_in  # quantization_config untouched
    assert prov["arm"] == arm and prov["servable"] == (arm != "probe")
    assert prov["source"] == {"path": str(src)} and prov["version"]
    assert (prov["manifest"], prov["source_manifest"]) == ("SHA256SUMS", "SHA256SUMS.source")
    assert ("warning" in prov) == (arm == "probe")

    # the manifests: plain sha256 of every file (reference: hashlib over the bytes), the output's
    # covering config.json and the source's list; the statistics beside them, tied by the digest
    def sums(d, names):
        return "".join(f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(names))

    src_files = [p.name for p in src.iterdir()]
    assert (out / "SHA256SUMS.source").read_text() == sums(src, src_files)
    out_files = [p.name for p in out.iterdir() if p.name not in ("SHA256SUMS", "requant-convert.json")]
    assert (out / "SHA256SUMS").read_text() == sums(out, out_files)
    digest = "sha256:" + hashlib.sha256((out / "SHA256SUMS").read_bytes()).hexdigest()
    assert res.manifest_digest == digest == json.loads((out / "requant-convert.json").read_text())["manifest_digest"]
    assert res.source_digest == "sha256:" + hashlib.sha256((out / "SHA256SUMS.source").read_bytes()).hexdigest()
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
    write_custom(
        src / "model.safetensors",
        tensors,
        header_order=names[::-1],
        data_order=names,
        metadata={"format": "pt", "note": "hand made"},
        metadata_last=True,
        pad=13,
    )
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
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}, indent=2)
    )
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
    assert prov["source"] == {"path": str(tmp_path / "a")}
    # the chain: b's source list holds a's config.json (with a's provenance) and a's own manifests
    listed = dict(
        reversed(line.split("  ")) for line in (tmp_path / "b" / "SHA256SUMS.source").read_text().splitlines()
    )
    assert listed["config.json"] == hashlib.sha256((tmp_path / "a" / "config.json").read_bytes()).hexdigest()
    assert "SHA256SUMS.source" in listed and "SHA256SUMS" not in listed and "requant-convert.json" not in listed


def test_deterministic_digest_and_bytes(tmp_path, micro):
    r1 = convert(micro, tmp_path / "a", "mse")
    r2 = convert(micro, tmp_path / "b", "mse")
    assert r1.source_digest == r2.source_digest and r1.manifest_digest == r2.manifest_digest
    assert tree_bytes(tmp_path / "a") == tree_bytes(
        tmp_path / "b"
    )  # requant-convert.json included: no times, no paths of OUT


def test_given_source_hashes_give_the_same_bytes(tmp_path, micro):
    """requant eval hashes its checkpoint once and passes the entries to every arm's
    conversion. Reference: the conversion that hashes its source itself (and hashlib, for
    SHA256SUMS.source). Entries that do not name the source's files are refused before
    anything is written."""
    from requant.errors import CheckpointError
    from requant.evidence import manifest as mf

    entries: dict = {}
    mf.identity(micro, entries_out=entries)
    assert {rel: e.sha256 for rel, e in entries.items()} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in micro.iterdir() if p.is_file()
    }
    convert(micro, tmp_path / "self", "nearest")
    convert(micro, tmp_path / "given", "nearest", src_entries=entries)
    assert tree_bytes(tmp_path / "given") == tree_bytes(tmp_path / "self")
    short = dict(list(entries.items())[1:])
    with pytest.raises(CheckpointError, match="do not name the checkpoint's files"):
        convert(micro, tmp_path / "bad", "nearest", src_entries=short)
    assert not (tmp_path / "bad").exists() and leftovers(tmp_path, "bad") == []


def test_existing_output_needs_force(tmp_path, micro):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    (out / "config.json").write_text("{}")  # recognisably a checkpoint: --force may replace it
    (out / "model.safetensors").write_bytes(b"")
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
    real = requant.scales.arms.Requantizer.finish
    calls = []

    def flaky(self):
        calls.append(1)
        if len(calls) == 5:  # half way through the 14 Linears
            raise exc
        return real(self)

    monkeypatch.setattr(requant.scales.arms.Requantizer, "finish", flaky)
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

    monkeypatch.setattr(requant.scales.arms.Requantizer, "rows", boom)
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
    prov = json.loads((tmp_path / "ceil" / "config.json").read_text())[PROVENANCE_KEY]
    assert prov["bf16_source"] == str(tmp_path / "bf16")
    ck = open_checkpoint(tmp_path / "ceil")
    orig = _all_tensors(tmp_path / "bf16")
    for lin in ck.quantized_linears:
        q2, s2 = ck.weight_and_scale(lin)
        assert bool(is_power_of_two(s2).all())
        # w / s' is exact in float64 (s' a power of two). Ceiling from the originals: every
        # |w / s'| <= 128, so a weight clips only from 127.5..128 (by less than one step),
        # and the layer's count is exactly the weights whose rounding leaves [-128, 127]
        x = orig[lin + ".weight"].double() / s2.double()
        assert bool((x.abs() <= 128).all()), lin
        r = torch.round(x)  # half to even, as the converter rounds
        assert torch.equal(q2, r.clamp(-128, 127).to(torch.int8)), lin
        assert res.layers[lin].weights_clipped == int(((r > 127) | (r < -128)).sum()), lin


def test_mse_costs_less_than_nearest_and_ceiling(tmp_path, default_copy):
    """Per layer and per channel, mse's squared error is at most min(nearest, ceiling).
    Reference: the errors recomputed from the output tensors in float64, exact here (bf16
    scales: every q's' - qs and its square is exact, and the row sums stay within 53 bits)."""
    src = _all_tensors(default_copy)
    outs = {}
    for arm in ("nearest", "ceiling", "mse"):
        convert(default_copy, tmp_path / arm, arm)
        outs[arm] = _all_tensors(tmp_path / arm)
    for lin in open_checkpoint(default_copy).quantized_linears:
        ref = src[lin + ".weight"].double() * src[lin + ".weight_scale"].double()
        err = {
            arm: ((t[lin + ".weight"].double() * t[lin + ".weight_scale"].double() - ref) ** 2).sum(1)
            for arm, t in outs.items()
        }
        assert bool((err["mse"] <= torch.minimum(err["nearest"], err["ceiling"])).all()), lin
        assert float(err["mse"].sum()) <= min(float(err["nearest"].sum()), float(err["ceiling"].sum())), lin


def test_fp32_scales(tmp_path, micro):
    """fp32 scales (24-bit mantissas: the float64 path) convert exactly and stay fp32."""
    from requant.io.safetensors_io import library_order, write_file

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


def test_local_path_spellings_record_no_hub_resolution(tmp_path, monkeypatch, micro):
    """A Hub id and revision are recorded only for a snapshot that snapshot_download produced
    (test_hub_cache covers that case), never for a local directory spelled differently."""
    monkeypatch.chdir(tmp_path)
    for i, spelling in enumerate(["./micro/", "micro", str(micro) + "/", "./micro/../micro"]):
        convert(spelling, f"out{i}", "nearest")
        prov = json.loads((tmp_path / f"out{i}" / "config.json").read_text())[PROVENANCE_KEY]
        assert prov["source"] == {"path": spelling}
    assert open_checkpoint("./micro/").from_hub is False


def _record_fs_ops(monkeypatch):
    """Record os.fsync (by path, via /proc/self/fd) and os.rename calls, in order."""
    import os

    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(a, b):
        events.append(("rename", str(a), str(b)))
        return real_rename(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    return events


def test_outputs_are_fsynced_before_and_after_the_rename(tmp_path, monkeypatch, micro_sharded):
    events = _record_fs_ops(monkeypatch)
    out = tmp_path / "outs" / "out"
    convert(micro_sharded, out, "nearest", jobs=2)
    renames = [i for i, e in enumerate(events) if e[0] == "rename"]
    assert len(renames) == 1
    _, tmp, final = events[renames[0]]
    assert final == str(out) and tmp.startswith(str(out.parent / ".out.requant-tmp-"))
    before = {e[1] for e in events[: renames[0]] if e[0] == "fsync"}
    after = {e[1] for e in events[renames[0] :] if e[0] == "fsync"}
    for p in sorted(micro_sharded.iterdir()):  # every file, shards and the rest
        assert f"{tmp}/{p.name}" in before, p.name
    assert tmp in before  # the directory's entries
    assert str(out.parent) in after and str(tmp_path) in after  # the rename, and the created parent


def test_symlinked_output_is_replaced_in_its_own_directory(tmp_path, monkeypatch, micro):
    """OUT is a symlink to a directory elsewhere: the temp dir and the moved-aside link
    live next to OUT (one directory, so no rename crosses a device), the link is replaced
    by the new output and its target is left alone."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "target").mkdir(parents=True)
    (elsewhere / "target" / "keep.txt").write_text("x")
    here = tmp_path / "here"
    here.mkdir()
    out = here / "out"
    out.symlink_to(elsewhere / "target", target_is_directory=True)
    with pytest.raises(OutputError, match="--force"):
        convert(micro, out, "nearest")
    events = _record_fs_ops(monkeypatch)
    convert(micro, out, "nearest", force=True)
    renames = [e for e in events if e[0] == "rename"]
    assert len(renames) == 2
    for _, a, b in renames:
        assert (
            str(tmp_path / "here")
            == str(__import__("pathlib").Path(a).parent)
            == str(__import__("pathlib").Path(b).parent)
        )
    assert out.is_dir() and not out.is_symlink() and (out / "model.safetensors").exists()
    assert (
        sorted(p.name for p in elsewhere.iterdir()) == ["target"]
        and (elsewhere / "target" / "keep.txt").read_text() == "x"
    )
    assert leftovers(here, "out") == ["out"]


@pytest.mark.parametrize("force", [False, True])
def test_output_appearing_during_conversion(tmp_path, monkeypatch, micro, force):
    """OUT created by someone else after the initial check: without force it is an error
    and that OUT is left exactly as it is; with force it is replaced (when it is a checkpoint:
    anything else is refused, tests/requant/convert/test_convert_force.py)."""
    import requant.io.output

    out = tmp_path / "out"
    real = requant.io.output.fsync_tree

    def racing(root, skip):
        out.mkdir()
        (out / "theirs.txt").write_text("someone else's")
        if force:
            (out / "config.json").write_text("{}")
            (out / "model.safetensors").write_bytes(b"")
        return real(root, skip)

    monkeypatch.setattr(requant.io.output, "fsync_tree", racing)
    if not force:
        with pytest.raises(OutputError, match="appeared while converting"):
            convert(micro, out, "nearest")
        assert tree_bytes(out) == {"theirs.txt": b"someone else's"}
    else:
        convert(micro, out, "nearest", force=True)
        assert not (out / "theirs.txt").exists() and (out / "model.safetensors").exists()
    assert leftovers(tmp_path, "out") == ["out"]


@pytest.mark.parametrize("jobs", [1, 4])
def test_write_error_names_the_output_shard(tmp_path, monkeypatch, micro_sharded, jobs):
    """A disk-full pwrite: OutputError naming the output shard file and tensor of the first
    failing unit in file order (every shard fails; with 4 workers the later ones may fail
    first, and the report must not depend on that), and no output (nor temp dir) left."""
    import errno
    import re

    import requant.convert._streaming

    real = requant.convert._streaming._pwrite_all

    def full(fd, data, offset):
        if offset > 0:  # headers go through, tensor data does not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(requant.convert._streaming, "_pwrite_all", full)
    parent = tmp_path / "outs"
    with pytest.raises(OutputError) as ei:
        convert(micro_sharded, parent / "out", "nearest", jobs=jobs)
    msg = str(ei.value)
    shards = sorted(p.name for p in micro_sharded.glob("model-*.safetensors"))
    assert ei.value.file == str(parent / "out" / shards[0]) and ei.value.tensor
    assert "No space left on device" in msg and "writing the output shard failed" in msg
    assert re.findall(r"model-\d+-of-\d+\.safetensors", msg) == [shards[0]]  # the first unit's error, alone
    # its first write of tensor data: the first tensor in file order that is not a scale
    # (scales are written with their weight)
    first_tensor = next(
        t.name for t in open_checkpoint(micro_sharded).shards[shards[0]].by_offset if not t.name.endswith("_scale")
    )
    assert ei.value.tensor == first_tensor
    assert not parent.exists() or leftovers(parent, "out") == []


def test_read_error_names_the_source_shard(tmp_path, monkeypatch, micro_sharded):
    import errno
    import os
    import threading

    real = os.preadv

    def failing(fd, bufs, offset):
        if threading.current_thread().name.startswith("requant-convert"):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", failing)
    from requant.errors import TensorError

    with pytest.raises(TensorError) as ei:
        convert(micro_sharded, tmp_path / "out", "nearest", jobs=1)
    first = sorted(micro_sharded.glob("model-*.safetensors"))[0]
    assert ei.value.file == str(first) and ei.value.tensor and "Input/output error" in str(ei.value)
    assert leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("arm", ["unconstrained", "nearest", "mse"])
def test_tiny_pieces_and_parallel_units_give_the_same_bytes(tmp_path, monkeypatch, micro_sharded, arm):
    """The streaming and parallel paths with pieces far smaller than a tensor (blocks of a
    few rows, 16-byte pass-through chunks, 256-byte segments: many units per shard and
    many pieces per tensor), with 1 and 4 workers: the same bytes as each other and as the
    run with the default sizes (reference), the manifests and statistics included (plain
    sha256 of whole files: nothing depends on how the work was cut)."""
    import requant.convert._streaming as conv

    ref = tmp_path / "ref"
    convert(micro_sharded, ref, arm)
    assert (
        len(conv.segments(open_checkpoint(micro_sharded).shards[sorted(open_checkpoint(micro_sharded).shards)[0]])) == 1
    )
    monkeypatch.setattr(conv, "BLOCK_BYTES", 64)
    monkeypatch.setattr(conv, "CHUNK", 16)
    monkeypatch.setattr(conv, "SEGMENT", 256)
    ck = open_checkpoint(micro_sharded)
    assert max(len(conv.segments(f)) for f in ck.shards.values()) > 4
    assert any(
        info.nbytes > 16 for f in ck.shards.values() for info in f.by_offset if info.name.endswith("norm.weight")
    )
    cols = min(ck.info(lin + ".weight").shape[1] for lin in ck.quantized_linears)
    assert 64 // cols < min(
        ck.info(lin + ".weight").shape[0] for lin in ck.quantized_linears
    )  # several blocks per weight
    r1 = convert(micro_sharded, tmp_path / "j1", arm, jobs=1)
    r4 = convert(micro_sharded, tmp_path / "j4", arm, jobs=4)
    t1, t4, tref = tree_bytes(tmp_path / "j1"), tree_bytes(tmp_path / "j4"), tree_bytes(ref)
    assert t1 == t4 and r1.source_digest == r4.source_digest
    for lin, st in r1.layers.items():
        assert st.to_dict() == r4.layers[lin].to_dict()
    assert t1 == tref and r1.manifest_digest == r4.manifest_digest
    if arm == "unconstrained":
        assert tref == tree_bytes(micro_sharded)
