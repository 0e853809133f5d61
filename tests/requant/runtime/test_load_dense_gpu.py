"""runtime.load_dense on CUDA (each tensor read straight into page-locked memory, copied without
blocking, checked finite on the GPU) against load_dense on the CPU (the reader's bytes, the CPU
check): the same tensors bit for bit, and the same refusal of a NaN embedding (marker gpu)."""

import shutil

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint import open_checkpoint
from requant.errors import TensorError
from requant.runtime import load_dense
from tests.requant.commands.test_messages import _nan_in

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_load_equals_the_cpu_load_and_refuses_the_same_nan(tmp_path):
    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    want, got = load_dense(ckpt, "cpu"), load_dense(ckpt, "cuda")
    assert list(got) == list(want)
    for n, t in want.items():
        assert got[n].is_cuda and torch.equal(got[n].cpu().view(torch.int16), t.view(torch.int16)), n
    d = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, d, ignore=shutil.ignore_patterns("SHA256SUMS"))
    _nan_in(d / "model.safetensors", "model.embed_tokens.weight")
    bad = open_checkpoint(d)
    messages = []
    for dev in ("cpu", "cuda"):
        with pytest.raises(TensorError) as e:
            load_dense(bad, dev)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "nan at flat index 3" in messages[0]
