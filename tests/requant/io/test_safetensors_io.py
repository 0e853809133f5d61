"""requant.io.safetensors_io against the safetensors library (reference:
safetensors.torch.save_file / load_file), plus the format checks."""

import json
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from requant.errors import SafetensorsFormatError
from requant.io.safetensors_io import DTYPES, library_order, read_header, serialize_header, write_file

DTS = [
    torch.int8,
    torch.uint8,
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.int16,
    torch.bool,
]


def _rand(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen).to(dtype)


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t


@st.composite
def tensor_dicts(draw):
    n = draw(st.integers(1, 6))
    names = draw(st.lists(st.text("abcxyz._0123456789", min_size=1, max_size=12), min_size=n, max_size=n, unique=True))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    out = {}
    for name in names:
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
        out[name] = _rand(shape, draw(st.sampled_from(DTS)), gen)
    return out


@settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # no ./.hypothesis
@given(tensors=tensor_dicts(), with_meta=st.booleans())
def test_writer_matches_library_and_reader_matches_load_file(tmp_path, tensors, with_meta):
    """Reference: safetensors.torch.save_file bytes and load_file values."""
    meta = {"format": "pt"} if with_meta else None
    ref, ours = tmp_path / "ref.safetensors", tmp_path / "ours.safetensors"
    save_file(tensors, str(ref), metadata=meta)
    write_file(ours, [(n, tensors[n]) for n in library_order(tensors)], meta)
    assert ours.read_bytes() == ref.read_bytes()
    f = read_header(ref)
    raw = ref.read_bytes()
    assert f.prefix == raw[: 8 + int.from_bytes(raw[:8], "little")]
    assert f.metadata == meta
    loaded = load_file(str(ref))
    for name, t in loaded.items():
        got = f.tensor(name)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(_bits(got), _bits(t))
        direct = f.tensor_direct(name, pin=torch.cuda.is_available())  # one pread into the tensor
        assert direct.dtype == t.dtype and direct.shape == t.shape and torch.equal(_bits(direct), _bits(t))


def test_header_is_padded_with_spaces_to_8_bytes():
    prefix, infos = serialize_header([("a", "I8", (3,)), ("b", "BF16", (2, 1))], {"format": "pt"})
    n = int.from_bytes(prefix[:8], "little")
    assert len(prefix) == 8 + n and n % 8 == 0
    assert (
        prefix[8:].rstrip(b" ")
        == b'{"__metadata__":{"format":"pt"},"a":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[3,7]}}'
    )
    assert [(i.begin, i.end) for i in infos] == [(0, 3), (3, 7)]


def _file(tmp_path, header: dict | bytes, data: bytes, n_override=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "t.safetensors"
    p.write_bytes(struct.pack("<Q", n_override if n_override is not None else len(raw)) + raw + data)
    return p


@pytest.mark.parametrize(
    "header,data,n_override,needle",
    [
        (b"", b"", None, "header is not a JSON object"),
        (b"{not json", b"", None, "not valid JSON"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        ({"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}, b"\0\0", None, "truncated"),
        ({"a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0\0", None, "trailing bytes"),
        (
            {
                "a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "I8", "shape": [2], "data_offsets": [3, 5]},
            },
            b"\0" * 5,
            None,
            "gap",
        ),
        (
            {
                "a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "I8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"\0" * 3,
            None,
            "overlap",
        ),
        ({"a": {"dtype": "I8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3, None, "gap"),
        ({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "needs 4"),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "unknown dtype"),
        ({"a": {"dtype": "I8", "shape": [-2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "shape"),
        ({"a": {"dtype": "I8", "shape": [2]}}, b"\0" * 2, None, "exactly dtype, shape and data_offsets"),
        ({"__metadata__": {"format": 1}}, b"", None, "__metadata__"),
        (
            b'{"a": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}}',
            b"\0",
            None,
            "duplicate",
        ),
        (b"{}", b"", 10_000, "past the end"),
        (b"{}", b"", 10**12, "exceeds"),
    ],
)
def test_format_errors_name_the_file(tmp_path, header, data, n_override, needle):
    p = _file(tmp_path, header, data, n_override)
    with pytest.raises(SafetensorsFormatError) as ei:
        read_header(p)
    assert needle in str(ei.value)
    assert str(p) in str(ei.value)


def test_file_shorter_than_length_field(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x10\x00\x00")
    with pytest.raises(SafetensorsFormatError, match="shorter than the 8-byte header length"):
        read_header(p)


def test_offset_errors_name_the_tensor(tmp_path):
    p = _file(
        tmp_path,
        {
            "w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]},
            "x": {"dtype": "I8", "shape": [2], "data_offsets": [1, 3]},
        },
        b"\0" * 3,
    )
    with pytest.raises(SafetensorsFormatError) as ei:
        read_header(p)
    assert "'x'" in str(ei.value) and "'w'" in str(ei.value)


def test_all_dtypes_round_trip(tmp_path):
    """Reference: safetensors.torch.load_file."""
    gen = torch.Generator().manual_seed(0)
    tensors = {
        f"t{i}": _rand((3, 2), DTYPES[d][0], gen)
        if DTYPES[d][0] not in (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2)
        else torch.zeros(3, 2, dtype=DTYPES[d][0])
        for i, d in enumerate(DTYPES)
    }
    p = tmp_path / "all.safetensors"
    write_file(p, list(tensors.items()), {"format": "pt"})
    ref = load_file(str(p))
    f = read_header(p)
    for n, t in ref.items():
        assert (
            torch.equal(f.tensor(n).view(torch.uint8), t.view(torch.uint8))
            if t.dtype != torch.bool
            else torch.equal(f.tensor(n), t)
        )


def test_null_metadata_is_accepted_and_kept(tmp_path):
    p = _file(tmp_path, {"__metadata__": None, "a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\xff")
    f = read_header(p)
    assert f.metadata is None and f.tensor("a").tolist() == [1, -1]
    assert f.prefix == p.read_bytes()[:-2]  # the raw header, kept as written
