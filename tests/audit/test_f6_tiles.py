"""audit/f6_tiles.py's Triton kernel equals F6's definition (audit.catalogue.faults.accumulate_bf16_tiles,
torch, tile by tile) bit for bit: under Triton's interpreter on CPU (a child process, so that
TRITON_INTERPRET is set before Triton is imported) and on a GPU (marker gpu)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import torch
from requant.audit.f6_tiles import accumulate_bf16_tiles_triton
from requant.audit.catalogue.faults import accumulate_bf16_tiles
dev = "{dev}"
for seed, (m, k, n) in enumerate([(1, 256, 64), (8, 200, 40), (36, 1024, 96), (17, 64, 33), (5, 0, 7)]):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), generator=g).to(torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    if k:
        a[0, : k // 2] = 127  # long runs of large products: the bf16 register loses bits
        w[0, : k // 2] = 127
    want = accumulate_bf16_tiles(a, w)
    got = accumulate_bf16_tiles_triton(a.to(dev), w.to(dev)).cpu()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (m, k, n)
print("equal")
"""


def _run(dev: str, env: dict) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHECK.format(dev=dev)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and "equal" in res.stdout, res.stderr[-3000:]


def test_f6_kernel_under_the_interpreter_equals_the_definition():
    pytest.importorskip("triton")
    _run("cpu", {**os.environ, "TRITON_INTERPRET": "1"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_f6_kernel_on_the_gpu_equals_the_definition():
    _run("cuda", {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
