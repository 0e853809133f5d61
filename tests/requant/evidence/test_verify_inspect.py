"""requant.evidence.verify and requant.checkpoint.inspect as library calls. References: the files themselves
(byte comparison), and the tensors read with safetensors.torch.load_file."""

import json

from requant.checkpoint.inspect import inspect_checkpoint
from requant.evidence.verify import verify
from tests.requant.conftest import load_all


def test_verify_matches_tensors_across_different_sharding(micro, micro_sharded):
    """Same tensors, different shard layout: not identical, but no tensor differs."""
    rep = verify(micro, micro_sharded)
    assert rep["identical"] is False and rep["tensors"] == []
    assert "model.safetensors" in rep["only_in_a"] and "model.safetensors.index.json" in rep["only_in_b"]
    assert "tensor data identical" in rep["note"]


def test_verify_reports_one_changed_element(tmp_path, micro):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(micro, other)
    from requant.io.safetensors_io import read_header

    f = read_header(other / "model.safetensors")
    info = f.info("model.layers.0.mlp.down_proj.weight")
    raw = bytearray((other / "model.safetensors").read_bytes())
    raw[f.data_start + info.begin + 7] ^= 0x01
    (other / "model.safetensors").write_bytes(bytes(raw))
    rep = verify(micro, other)
    assert rep["differing_files"] == ["model.safetensors"]
    assert rep["tensors"] == [
        {
            "tensor": "model.layers.0.mlp.down_proj.weight",
            "file_a": "model.safetensors",
            "file_b": "model.safetensors",
            "what": "values",
            "elements_differing": 1,
            "elements": info.numel,
            "first_index": 7,
        }
    ]
    assert verify(micro, micro)["identical"] is True


def test_inspect_sharded(micro_sharded):
    info = inspect_checkpoint(micro_sharded)
    tensors = {}
    for p in sorted(micro_sharded.glob("*.safetensors")):
        tensors.update(load_all(p))
    qs = [t for n, t in tensors.items() if n.endswith(".weight") and n[: -len(".weight")] + ".weight_scale" in tensors]
    assert info["quantized_linears"] == len(qs) == 14
    assert info["int8_range"] == [min(int(q.min()) for q in qs), max(int(q.max()) for q in qs)]
    assert info["int8_min128_count"] == sum(int((q == -128).sum()) for q in qs)
    assert len(info["shards"]) > 2 and info["bytes"] == sum(
        p.stat().st_size for p in micro_sharded.glob("*.safetensors")
    )
    json.dumps(info)  # machine-readable as is


def test_verify_reads_tensors_only_from_differing_files(tmp_path, monkeypatch, micro_sharded):
    """One changed shard: only that shard's tensors are read; the byte-identical shards are
    not read again, and the one changed element is still reported."""
    import shutil

    from requant.io.safetensors_io import SafetensorsFile, read_header

    other = tmp_path / "other"
    shutil.copytree(micro_sharded, other)
    shards = sorted(p.name for p in other.glob("model-*.safetensors"))
    changed = shards[1]
    f = read_header(other / changed)
    name = f.by_offset[0].name
    raw = bytearray((other / changed).read_bytes())
    raw[f.data_start + f.info(name).begin] ^= 0x01
    (other / changed).write_bytes(bytes(raw))
    reads = []
    real = SafetensorsFile.read_bytes

    def spy(self, n):
        reads.append(self.path.name)
        return real(self, n)

    monkeypatch.setattr(SafetensorsFile, "read_bytes", spy)
    rep = verify(micro_sharded, other)
    assert rep["differing_files"] == [changed]
    assert [d["tensor"] for d in rep["tensors"]] == [name] and rep["tensors"][0]["elements_differing"] == 1
    assert reads and set(reads) == {changed} and len(reads) == 2 * len(f.tensors)
