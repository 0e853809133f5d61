"""audit/records.py: operand digests (reference: hashlib.sha256 of bytes serialized here
with struct from Python numbers, never from the digest itself) and the
kernel descriptions' exact-integer bounds (reference: kernels.reference.MAX_K)."""

import hashlib
import struct

import torch

from requant.audit.records import BACKEND_KERNELS, REFERENCE_KERNEL, Activations, KernelDesc, Weights, tensor_digest
from requant.kernels import EMULATION_OF


def test_digest_is_sha256_of_dtype_shape_and_bytes():
    t = torch.tensor([[1, -2, 3]], dtype=torch.int8)
    h = hashlib.sha256(b"torch.int8|(1, 3)|" + bytes([1, 0xFE, 3])).hexdigest()
    assert tensor_digest(t) == h
    assert tensor_digest(t.view(3, 1)) != h  # same bytes, other shape
    assert tensor_digest(t.view(torch.uint8)) != h  # same bytes, other dtype
    assert tensor_digest(t.t().contiguous().t()) == h  # layout does not matter


def _expected(*parts) -> str:
    """sha256 over "<dtype>|<shape>|" + the little-endian bytes of each part, the bytes
    serialized here with struct from Python numbers (not from the tensors)."""
    h = hashlib.sha256()
    for dtype, shape, fmt, values in parts:
        h.update(f"{dtype}|{shape}|".encode())
        h.update(struct.pack("<" + fmt * len(values), *values))
    return h.hexdigest()


def test_operand_digests_against_hashlib():
    """Activations and Weights digests: hashlib over independently serialized bytes, one
    bit of a scale or one int8 value changes it, and the digest is cached (it describes
    the operands at first use)."""
    a_vals = [0, -1, 127, -128, 5, 6, 7, 8]
    s_vals = [0.5, 0.1]
    a = torch.tensor(a_vals, dtype=torch.int8).reshape(2, 4)
    s = torch.tensor(s_vals, dtype=torch.float32).reshape(2, 1)
    want = _expected(("torch.int8", "(2, 4)", "b", a_vals), ("torch.float32", "(2, 1)", "f", s_vals))
    x = Activations(a, s)
    assert x.digest() == want
    w_vals = [1, 2, -3, 4, -128, 127]
    ws_vals = [2.0**-7, 0.0037]
    w = torch.tensor(w_vals, dtype=torch.int8).reshape(3, 2)
    ws = torch.tensor(ws_vals, dtype=torch.float32).reshape(2, 1)
    assert Weights(w, ws).digest() == _expected(
        ("torch.int8", "(3, 2)", "b", w_vals), ("torch.float32", "(2, 1)", "f", ws_vals)
    )
    s2 = s.clone()
    s2[1, 0] = torch.nextafter(s2[1, 0], torch.tensor(1.0))  # one ulp of one scale
    bumped = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", s_vals[1]))[0] + 1))[0]
    assert (
        Activations(a, s2).digest()
        == _expected(("torch.int8", "(2, 4)", "b", a_vals), ("torch.float32", "(2, 1)", "f", [0.5, bumped]))
        != want
    )
    a2 = a.clone()
    a2[0, 0] = 1
    assert (
        Activations(a2, s).digest()
        == _expected(("torch.int8", "(2, 4)", "b", [1] + a_vals[1:]), ("torch.float32", "(2, 1)", "f", s_vals))
        != want
    )
    x.s_a[0, 0] = 7.0  # cached: the digest describes the operands at first use
    assert x.digest() == want


def test_kernel_bounds():
    assert REFERENCE_KERNEL.exact_integer_bound() == 2**31 - 1
    assert KernelDesc("bf16", "float", 8, "x").exact_integer_bound() == 256
    assert KernelDesc("i16", "int", 16, "x").exact_integer_bound() == 32767
    for name in EMULATION_OF:  # every registered backend with an order is described
        k = BACKEND_KERNELS[name]
        assert k.acc_kind == "int" and k.acc_bits == 32 and not k.exposes_acc
        assert k.epilogue == EMULATION_OF[name].removeprefix("reference-")
