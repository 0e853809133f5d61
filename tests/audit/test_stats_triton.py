"""audit/stats_triton.py's one-pass statistics equal the torch formulation (audit/batched_stats.py: the
int16 mismatch count, _ordinal distances, torch.isnan, _row_hist) bit for bit, and the batched path
using them equals the per-cell path (cells.layer_cells) cell by cell on crafted layers with every
fault family, NaN rows and zero scales: under Triton's interpreter on the CPU (a child process, so
that TRITON_INTERPRET is set before Triton is imported) and on a GPU (marker gpu)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import torch
from requant.audit import batched_stats
from requant.audit.batched_stats import _ordinal, _row_hist
from requant.audit.stats_triton import row_stats
dev = "{dev}"
g = torch.Generator().manual_seed(0)
for c, r, n in [(3, 5, 300), (2, 1, 17), (4, 3, 1000), (1, 2, 256)]:
    ref = torch.randint(-2**15, 2**15, (r, n), generator=g).to(torch.int16)
    ys = ref.unsqueeze(0).repeat(c, 1, 1)
    far = torch.randint(-2**15, 2**15, (c, r, n), generator=g).to(torch.int16)
    near = (ref.to(torch.int32) + torch.randint(-3, 4, (c, r, n), generator=g)).clamp(-2**15, 2**15 - 1)
    ys = torch.where(torch.rand(c, r, n, generator=g) < 0.3, far, ys)  # every distance, NaN bit patterns too
    ys = torch.where(torch.rand(c, r, n, generator=g) < 0.3, near.to(torch.int16), ys)
    ys[0, 0, 0], ref[-1, -1] = 0x7FC1, -0x3F  # NaN on the output's side (payload), on the reference's (0xFFC1)
    ys, ref = ys.view(torch.bfloat16), ref.view(torch.bfloat16)
    got = row_stats(ys.to(dev), ref.to(dev), block=64).cpu().to(torch.int64)
    assert torch.equal(row_stats(ys.to(dev), ref.to(dev)).cpu().to(torch.int64), got)  # the default block
    yb, rb = ys.view(torch.int16), ref.view(torch.int16)
    d = (_ordinal(yb) - _ordinal(rb)).abs_()
    nan = torch.isnan(ys) | torch.isnan(ref)
    h = _row_hist(d, nan)
    assert nan.any() and (d > 2**14).any()
    assert torch.equal(got[:, :, 0], (yb != rb).sum(2))
    assert torch.equal(got[:, :, 1:18], h[:, :, :17]) and torch.equal(got[:, :, 18], h[:, :, 31])
    assert torch.equal(got[:, :, 30], torch.where(nan, 0, d).amax(2).to(torch.int64))
if dev == "cpu":  # the batched path through the kernel against the per-cell oracle
    from tests.audit.test_batched import CHECKS_V2, _compare, _segments
    from requant.backends import REFERENCE_PAIR
    batched_stats.HOST_SHORTCUTS = False
    batched_stats.TRITON_STATS = True
    for seed, (k, n) in enumerate([(96, 40), (200, 33)]):
        for pow2 in (False, True):
            labelled, wt = _segments(seed, [1, 8, 24], k, n, pow2, True)
            _compare("pow2" if pow2 else "native", labelled, wt, REFERENCE_PAIR, CHECKS_V2)
print("equal")
"""


def _run(dev: str, env: dict) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHECK.format(dev=dev)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and "equal" in res.stdout, res.stderr[-3000:]


def test_stats_kernel_under_the_interpreter_equals_the_torch_formulation_and_the_oracle():
    pytest.importorskip("triton")
    _run("cpu", {**os.environ, "TRITON_INTERPRET": "1"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stats_kernel_on_the_gpu_equals_the_torch_formulation():
    _run("cuda", {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
