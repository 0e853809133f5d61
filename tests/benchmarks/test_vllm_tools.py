"""benchmarks/vllm_wheels.py and the pure parts of benchmarks/vllm_client.py, on the CPU.

The repack is checked against the zip itself (the dropped members are gone, every other member
is byte-identical, RECORD names exactly the members kept) and the split against a plain
concatenation of its parts. vLLM itself never runs here."""

import importlib
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    return importlib.import_module(f"benchmarks.{name}")


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    record = "vllm-0.26.0.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(record, "".join(f"{n},sha256=x,{len(d)}\n" for n, d in members.items()) + f"{record},,\n")
    return path


def test_repack_drops_only_the_unused_kernels(tmp_path):
    vw = _load("vllm_wheels")
    members = {n: n.encode() * 3 for n in vw.DROPPED}
    members.update({d + "api.py": b"y = 2\n" for d in vw.DROPPED_DIRS})
    members.update({d + "include/x.hpp": b"//\n" for d in vw.DROPPED_DIRS})
    # kept: a sibling whose name only starts like a dropped folder
    members.update({"vllm/__init__.py": b"x = 1\n", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"\x7fELF fa3"})
    members.update({"vllm/third_party/fmha_sm100x.py": b"z = 3\n"})
    src = _wheel(tmp_path / "src.whl", members)
    out = vw.repack(src, tmp_path / "out.whl")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read("vllm-0.26.0.dist-info/RECORD").decode().splitlines()
        kept = {n: z.read(n) for n in names if not n.endswith("RECORD")}
    assert not names & set(vw.DROPPED) and not any(n.startswith(vw.DROPPED_DIRS) for n in names)
    assert kept == {
        "vllm/__init__.py": b"x = 1\n",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"\x7fELF fa3",
        "vllm/third_party/fmha_sm100x.py": b"z = 3\n",
    }
    assert {line.split(",")[0] for line in record} == set(kept) | {"vllm-0.26.0.dist-info/RECORD"}


def test_split_parts_join_to_the_whole(tmp_path):
    vw = _load("vllm_wheels")
    data = bytes(range(256)) * 41 + b"tail"
    whole = tmp_path / "t.tar"
    whole.write_bytes(data)
    parts = vw.split(whole, 1000)
    assert [p.name for p in parts] == [f"t.tar.part{i:02d}" for i in range(len(parts))]
    assert all(p.stat().st_size == 1000 for p in parts[:-1]) and 0 < parts[-1].stat().st_size <= 1000
    assert b"".join(p.read_bytes() for p in parts) == data


def test_scales_equal_bit_for_bit_with_fused_modules():
    vc = _load("vllm_client")
    file = {f"m.l0.self_attn.{p}": torch.tensor([2.0**-7, 0.011]) for p in ("q_proj", "k_proj", "v_proj")}
    held = {"m.l0.self_attn.qkv_proj": torch.cat(list(file.values()))}
    assert vc.scales_equal(held, file) == {"modules_checked": 1, "modules_differ": [], "equal": True}
    off = held["m.l0.self_attn.qkv_proj"].clone()
    off[4] = torch.nextafter(off[4], torch.tensor(1.0))  # one fp32 spacing: must be seen
    res = vc.scales_equal({"m.l0.self_attn.qkv_proj": off}, file)
    assert res["equal"] is False and res["modules_differ"] == ["m.l0.self_attn.qkv_proj"]


def test_first_diff():
    vc = _load("vllm_client")
    assert vc.first_diff([1, 2, 3], [1, 2, 3]) is None
    assert vc.first_diff([1, 2, 3], [1, 5, 3]) == 1
    assert vc.first_diff([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("tree", [0, 1, 39_190_000, 40_500_000, 66_108_863, 66_108_864])
def test_a_part_fits_beside_the_tree(tree):
    vw = _load("vllm_wheels")
    limit = 64 << 20
    if limit - tree - vw.SPARE < 1_000_000:
        with pytest.raises(ValueError):
            vw.part_bytes(tree)
        return
    got = vw.part_bytes(tree)
    assert got % 1_000_000 == 0 and tree + got + vw.SPARE <= limit  # fits, with the spare
    assert tree + got + 1_000_000 + vw.SPARE > limit  # one MB more would not


def test_repack_with_moe_keeps_only_the_moe_extension(tmp_path):
    vw = _load("vllm_wheels")
    members = {n: n.encode() * 2 for n in vw.DROPPED}
    members.update({d + "api.py": b"y = 2\n" for d in vw.DROPPED_DIRS})
    members["vllm/__init__.py"] = b"x = 1\n"
    src = _wheel(tmp_path / "src.whl", members)
    out = vw.repack(src, tmp_path / "out.whl", moe=True)
    with zipfile.ZipFile(out) as z:
        names = {n for n in z.namelist() if not n.endswith("RECORD")}
        record = {line.split(",")[0] for line in z.read("vllm-0.26.0.dist-info/RECORD").decode().splitlines()}
        assert z.read(vw.MOE_EXTENSION) == members[vw.MOE_EXTENSION]
    assert names == {"vllm/__init__.py", vw.MOE_EXTENSION}
    assert record == names | {"vllm-0.26.0.dist-info/RECORD"}
