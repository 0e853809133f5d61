"""audit/records.py: operand digests (reference: hashlib.sha256 of the raw bytes) and the
kernel descriptions' exact-integer bounds (reference: kernels.reference.MAX_K)."""

import hashlib

import torch

from requant.audit.records import BACKEND_KERNELS, REFERENCE_KERNEL, Activations, KernelDesc, tensor_digest
from requant.kernels import EMULATION_OF


def test_digest_is_sha256_of_dtype_shape_and_bytes():
    t = torch.tensor([[1, -2, 3]], dtype=torch.int8)
    h = hashlib.sha256(b"torch.int8|(1, 3)|" + bytes([1, 0xFE, 3])).hexdigest()
    assert tensor_digest(t) == h
    assert tensor_digest(t.view(3, 1)) != h  # same bytes, other shape
    assert tensor_digest(t.view(torch.uint8)) != h  # same bytes, other dtype
    assert tensor_digest(t.t().contiguous().t()) == h  # layout does not matter


def test_activation_digest_covers_scales_and_is_cached():
    a = torch.zeros(2, 4, dtype=torch.int8)
    s = torch.tensor([[0.5], [0.25]])
    x = Activations(a, s)
    d = x.digest()
    assert Activations(a.clone(), s.clone()).digest() == d
    s2 = s.clone()
    s2[1, 0] = torch.nextafter(s2[1, 0], torch.tensor(1.0))
    assert Activations(a, s2).digest() != d
    x.s_a[0, 0] = 7.0  # cached: the digest describes the operands at first use
    assert x.digest() == d


def test_kernel_bounds():
    assert REFERENCE_KERNEL.exact_integer_bound() == 2**31 - 1
    assert KernelDesc("bf16", "float", 8, "x").exact_integer_bound() == 256
    assert KernelDesc("i16", "int", 16, "x").exact_integer_bound() == 32767
    for name in EMULATION_OF:  # every registered backend with an order is described
        k = BACKEND_KERNELS[name]
        assert k.acc_kind == "int" and k.acc_bits == 32 and not k.exposes_acc
        assert k.epilogue == EMULATION_OF[name].removeprefix("reference-")
