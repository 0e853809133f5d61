"""audit/linears.py: the audit's Linears equal requant.runtime.load_linears (the converter's numpy
requantizer on the CPU) bit for bit, native and pow2; on CUDA pow2 is derived on the GPU from the
native tensors (marker gpu)."""

import pytest
import torch

from requant.audit.linears import AuditLinears, read_linear
from requant.checkpoint import open_checkpoint
from requant.checkpoint.synthetic import generate
from requant.runtime import load_linears


def _equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for n, (q, s) in want.items():
        assert torch.equal(got[n][0].cpu(), q) and torch.equal(got[n][1].cpu().view(torch.int32), s.view(torch.int32))


def test_cpu_loader_is_the_runtime_loader(tmp_path):
    ckpt = open_checkpoint(generate("tiny", tmp_path / "tiny"))
    loader = AuditLinears(ckpt, "cpu")
    for regime in ("native", "pow2"):
        _equal(loader.load(regime), load_linears(ckpt, regime, "cpu"))


def test_direct_read_equals_the_checkpoint_reader(tmp_path):
    """read_linear (one pread into the buffer the device copy reads) against
    Checkpoint.weight_and_scale (the safetensors reader), every Linear, bit for bit."""
    ckpt = open_checkpoint(generate("tiny", tmp_path / "tiny"))
    for n in ckpt.quantized_linears:
        q, s = read_linear(ckpt, n, pin=torch.cuda.is_available())
        wq, ws = ckpt.weight_and_scale(n)
        assert q.dtype == wq.dtype == torch.int8 and torch.equal(q, wq) and torch.equal(s, ws)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_loader_derives_pow2_on_the_gpu_equal_to_the_cpu_requantizer(tmp_path):
    ckpt = open_checkpoint(generate("tiny", tmp_path / "tiny"))
    loader = AuditLinears(ckpt, "cuda")
    native = loader.load("native")
    _equal(native, load_linears(ckpt, "native", "cpu"))
    pow2 = loader.load("pow2", native)
    assert not native  # each native Linear freed as its pow2 twin was made
    _equal(pow2, load_linears(ckpt, "pow2", "cpu"))
    _equal(AuditLinears(ckpt, "cuda").load("pow2"), load_linears(ckpt, "pow2", "cpu"))  # read, then requantized


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
@pytest.mark.parametrize("stack_bytes", [1, 150_000, 1 << 27])
def test_pow2_derived_in_stacks_equals_the_cpu_requantizer(tmp_path, monkeypatch, preset, stack_bytes):
    """The device derivation's stacking (AuditLinears._pow2_from: Linears of one shape and scale
    dtype requantized together, STACK_BYTES at a time) run on the CPU: every Linear equal to
    requant.runtime.load_linears' pow2 (the converter's numpy requantizer), in the checkpoint's
    order, with stacks of one Linear, stacks cut by the bound, and one stack per shape."""
    from requant.audit import linears

    monkeypatch.setattr(linears, "STACK_BYTES", stack_bytes)
    stacks = []

    def spy(pairs):
        stacks.append([q.numel() for q, _ in pairs])
        return many(pairs)

    many = linears.pow2_weights_many
    monkeypatch.setattr(linears, "pow2_weights_many", spy)
    ckpt = open_checkpoint(generate(preset, tmp_path / preset))
    loader = AuditLinears(ckpt, "cpu")
    native = load_linears(ckpt, "native", "cpu")
    loader.stored = {n: ckpt.weight_and_scale(n)[1] for n in ckpt.quantized_linears}
    got = loader._pow2_from(native, list(ckpt.quantized_linears))
    assert not native  # each native Linear handed over
    _equal(got, load_linears(ckpt, "pow2", "cpu"))
    # each stack within the bound (a larger Linear alone), every Linear in exactly one
    assert all(len(s) == 1 or sum(s) <= stack_bytes for s in stacks)
    assert sum(map(len, stacks)) == len(ckpt.quantized_linears)
    shapes = len({tuple(q.shape) for q, _ in got.values()})  # one scale dtype in these checkpoints
    if stack_bytes == 1:
        assert all(len(s) == 1 for s in stacks)
    elif stack_bytes == 150_000:  # some shapes cut into several stacks
        assert shapes < len(stacks) < len(ckpt.quantized_linears)
    else:
        assert len(stacks) == shapes
