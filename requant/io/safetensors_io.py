"""A byte-exact reader and writer for the safetensors format.

Why our own: `requant convert --arm unconstrained` must reproduce its input byte for
byte, header included (key order, `__metadata__`, the space padding that aligns the data
to 8 bytes). The safetensors library parses the header into a map and re-serialises it
on save, so a load/save round trip is only faithful when the input happened to be written
by the same library version. Here the raw header bytes are kept as read, and a converted
file is written as *the same header* followed by new data at the same offsets: requantizing
never changes a dtype or a shape, so the header stays valid as it is.

Why pread and not mmap: docs/checkpoints.md#reading-and-writing-the-decisions.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import torch

from requant.errors import SafetensorsFormatError, TensorError, os_reason
from requant.io import snapshot
from requant.io.inputs import not_regular

# safetensors dtype string -> (torch dtype, item size in bytes)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "BOOL": (torch.bool, 1),
    "U8": (torch.uint8, 1),
    "I8": (torch.int8, 1),
    "U16": (torch.uint16, 2),
    "I16": (torch.int16, 2),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "U32": (torch.uint32, 4),
    "I32": (torch.int32, 4),
    "F32": (torch.float32, 4),
    "U64": (torch.uint64, 8),
    "I64": (torch.int64, 8),
    "F64": (torch.float64, 8),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
}
TORCH_TO_ST = {td: name for name, (td, _) in DTYPES.items()}

MAX_HEADER = 100_000_000  # the safetensors library's own limit
ALIGNMENT = 8  # the library pads the header with spaces to a multiple of 8
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. begin/end are relative to the start of the data buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class SafetensorsFile:
    """A parsed, validated header; tensors are read lazily from `path`."""

    path: Path
    prefix: bytes  # the 8-byte length and the raw header bytes, padding included
    metadata: dict[str, str] | None
    tensors: dict[str, TensorInfo]  # in header order
    file_size: int
    by_offset: list[TensorInfo] = field(default_factory=list)  # in data order

    @property
    def data_start(self) -> int:
        return len(self.prefix)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsFormatError("no such tensor", file=self.path, tensor=name) from None

    def read_bytes(self, name: str) -> bytearray:
        """The raw bytes of one tensor (a fresh, writable buffer). An OSError while
        reading becomes a TensorError naming this file and the tensor."""
        info = self.info(name)
        buf = bytearray(info.nbytes)
        if info.nbytes:
            self._read_into(name, info, memoryview(buf))
        return buf

    def _read_into(self, name: str, info, view: memoryview) -> None:
        """The bytes of tensor `name` into `view` (one open, one pread_exact)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise TensorError(f"opening failed: {os_reason(exc)}", file=self.path, tensor=name) from exc
        try:
            snapshot.pin(self.path, os.fstat(fd))  # the file whose header was read, unchanged since
            pread_exact(fd, view, self.data_start + info.begin, file=self.path, tensor=name)
        finally:
            os.close(fd)

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor, read from disk into its own memory (not a view of the file)."""
        info = self.info(name)
        return bytes_to_tensor(self.read_bytes(name), info)

    def tensor_direct(self, name: str, pin: bool = False) -> torch.Tensor:
        """tensor(name), read by one pread straight into a fresh tensor's memory; with `pin` that
        memory is page-locked, so that a non-blocking copy to a GPU reads the very buffer the file
        was read into (no zero-filled bytearray, no second host copy)."""
        info = self.info(name)
        t = torch.empty(info.shape, dtype=info.torch_dtype, pin_memory=pin)
        if t.numel() * t.element_size() != info.nbytes:  # cannot happen for a validated header
            t = self.tensor(name)
            return t.pin_memory() if pin else t
        if info.nbytes:
            self._read_into(name, info, memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        return t


def pread_exact(fd: int, view: memoryview, offset: int, *, file, tensor: str | None) -> None:
    """Fill `view` with the bytes of fd at `offset`: requant's one preadv loop (a short read
    goes on where it stopped). An OSError, or the file ending before the view is full (it
    was truncated or rewritten after its header was validated), is a TensorError naming
    the file and the tensor."""
    got = 0
    while got < len(view):
        try:
            n = os.preadv(fd, [view[got:]], offset + got)
        except OSError as exc:
            raise TensorError(f"reading failed: {os_reason(exc)}", file=file, tensor=tensor) from exc
        if n == 0:
            raise TensorError(
                "file ended while reading (truncated or changed since it was validated?)", file=file, tensor=tensor
            )
        got += n


def bytes_to_tensor(buf: bytearray | bytes, info: TensorInfo) -> torch.Tensor:
    dtype = info.torch_dtype
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=dtype)
    if isinstance(buf, bytes):
        buf = bytearray(buf)
    return torch.frombuffer(buf, dtype=dtype).reshape(info.shape)


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """Little-endian bytes of a tensor in C order (what safetensors stores)."""
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_header(path: str | os.PathLike) -> SafetensorsFile:
    """Parse and validate a .safetensors file's header (see the module docstring)."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device never end
            raise SafetensorsFormatError(not_regular(st.st_mode), file=path)
        size = st.st_size
        with open(path, "rb") as f:
            snapshot.pin(path, os.fstat(f.fileno()))  # an input: its bytes must not change while read
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsFormatError(
                    f"truncated: {size} bytes, shorter than the 8-byte header length", file=path
                )
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER:
                raise SafetensorsFormatError(f"header length {n} exceeds the {MAX_HEADER}-byte limit", file=path)
            if 8 + n > size:
                raise SafetensorsFormatError(
                    f"header length {n} runs past the end of the file ({size} bytes)", file=path
                )
            raw = f.read(n)
    except FileNotFoundError:
        raise SafetensorsFormatError("file not found", file=path) from None
    except IsADirectoryError:
        raise SafetensorsFormatError("is a directory, not a file", file=path) from None
    if len(raw) != n:
        raise SafetensorsFormatError(f"truncated: header of {n} bytes but only {len(raw)} read", file=path)
    if not raw.startswith(b"{"):
        raise SafetensorsFormatError("header is not a JSON object (does not start with '{')", file=path)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise SafetensorsFormatError("header is not valid JSON: nested too deeply", file=path) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsFormatError(f"header is not valid JSON: {exc}", file=path) from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object", file=path)

    metadata = None
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == METADATA_KEY:
            if entry is None:  # the format allows "__metadata__": null
                continue
            if not isinstance(entry, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entry.items()
            ):
                raise SafetensorsFormatError("__metadata__ must map strings to strings", file=path)
            metadata = entry
            continue
        tensors[name] = _parse_entry(path, name, entry)

    data_size = size - 8 - n
    by_offset = sorted(tensors.values(), key=lambda t: (t.begin, t.end))
    pos = 0
    prev = None
    for t in by_offset:
        if t.begin != pos:
            kind = "gap" if t.begin > pos else "overlap"
            after = f"after tensor {prev.name!r} (ends at {pos})" if prev else "at the start of the data"
            raise SafetensorsFormatError(f"data_offsets {kind}: begins at {t.begin} {after}", file=path, tensor=t.name)
        pos = t.end
        prev = t
    if pos > data_size:
        raise SafetensorsFormatError(
            f"truncated: data ends at {pos} but the file holds only {data_size} data bytes",
            file=path,
            tensor=prev.name if prev else None,
        )
    if pos < data_size:
        raise SafetensorsFormatError(
            f"{data_size - pos} trailing bytes after the last tensor", file=path, tensor=prev.name if prev else None
        )
    return SafetensorsFile(
        path=path, prefix=head + raw, metadata=metadata, tensors=tensors, file_size=size, by_offset=by_offset
    )


def _parse_entry(path: Path, name: str, entry) -> TensorInfo:
    def bad(msg):
        return SafetensorsFormatError(msg, file=path, tensor=name)

    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("header entry must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise bad(f"data_offsets must be two non-negative integers, got {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise bad(f"data_offsets end {end} before begin {begin}")
    want = math.prod(shape) * DTYPES[dtype][1]
    if end - begin != want:
        raise bad(f"data_offsets span {end - begin} bytes but {dtype} {shape} needs {want}")
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def serialize_header(
    entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None
) -> tuple[bytes, list[TensorInfo]]:
    """Header bytes (8-byte length + JSON + space padding) for tensors laid out in the
    given order, the way the safetensors library writes them: `__metadata__` first,
    compact JSON, offsets contiguous in list order, padded with spaces to 8 bytes.

    entries: (name, safetensors dtype, shape). Returns (prefix, TensorInfo list).
    """
    header: dict = {}
    if metadata is not None:
        header[METADATA_KEY] = metadata
    infos = []
    pos = 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * DTYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        infos.append(TensorInfo(name, dtype, tuple(shape), pos, pos + nbytes))
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * ((ALIGNMENT - len(raw) % ALIGNMENT) % ALIGNMENT)
    return len(raw).to_bytes(8, "little") + raw, infos


def write_file(
    path: str | os.PathLike, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None
) -> None:
    """Write tensors in the given order (data in header order)."""
    entries = [(name, TORCH_TO_ST[t.dtype], tuple(t.shape)) for name, t in tensors]
    prefix, _ = serialize_header(entries, metadata)
    with open(path, "wb") as f:
        f.write(prefix)
        for _, t in tensors:
            f.write(tensor_to_bytes(t))


# The safetensors library's Dtype enum order (its Rust `Dtype` declaration order).
_LIBRARY_DTYPE_RANK = {
    n: i
    for i, n in enumerate(
        [
            "BOOL",
            "U8",
            "I8",
            "F8_E5M2",
            "F8_E4M3",
            "I16",
            "U16",
            "F16",
            "BF16",
            "I32",
            "U32",
            "F32",
            "F64",
            "I64",
            "U64",
        ]
    )
}


def library_order(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The order in which safetensors.torch.save_file lays out tensors: by dtype, in
    reverse order of the library's Dtype enum (F32 before BF16 before F16 before I8),
    then by name. Kept here so that our writer can reproduce its files byte for byte."""
    return sorted(tensors, key=lambda n: (-_LIBRARY_DTYPE_RANK[TORCH_TO_ST[tensors[n].dtype]], n))
