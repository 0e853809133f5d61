"""audit/phases/lean_faults.py: the injection's fault kernels against the catalogue's
(audit/conform/fault_kernels.py, the independent reference: audit/catalogue/faults.py's reference_case and
inject on every call, the reference output formed, F9's draws made on the host each time), bit for
bit, on operands drawn from a seeded generator (M, K, N, both scale regimes) with degenerate
activation scales: a zero row, every row zero (F9a draws among all rows), a NaN row.
"""

import random

import pytest
import torch

from requant.audit.catalogue.faults import accumulate_bf16_tiles
from requant.audit.conform.fault_kernels import FAULTS
from requant.audit.phases.lean_faults import VARIANT_OF, device_faults, lean_faults
from requant.kernels.reference import accumulate
from tests.audit.conftest import make_operands

N_CASES = 24


def _operands(seed: int):
    r = random.Random(seed)
    m, k, n = r.choice([1, 2, 3, 8, 17, 40]), r.choice([1, 63, 64, 65, 160, 256]), r.choice([1, 7, 48, 129])
    act, wt = make_operands(seed, m=m, k=k, n=n, pow2=seed % 2 == 1)
    s_a = act.s_a.clone()
    if seed % 4 == 1:
        s_a[r.randrange(m)] = 0.0
    elif seed % 4 == 2:
        s_a.zero_()
    elif seed % 4 == 3 and m > 1:
        s_a[r.randrange(m)] = float("nan")
    return act.a, wt.w, s_a, wt.s_w


def _bits(y):
    return y.view(torch.int16)


def _bits_one_nan(y):
    """The bits with every NaN as 0x7FC0: CUDA's float-to-bf16 conversion gives NaN as 0x7FFF, the
    CPU's as 0x7FC0 (measured on an H100: the NaN row of seed 3). A NaN's payload is the device's, not
    the fault's; the audit's statistics class any NaN as NaN (audit/stats_triton.py). Every other bit
    pattern, and where the NaNs are, is still compared exactly."""
    b = _bits(y).clone()
    b[torch.isnan(y)] = 0x7FC0
    return b


def test_device_fault_kernels_name_the_catalogue_variants():
    """device_faults names the catalogue's eleven kernels in its order; each runs the variant the
    catalogue's kernel of that name runs (fault_kernels' function names are the variant ids)."""
    assert list(device_faults("cpu")) == list(FAULTS)
    assert {f: fn.__name__ for f, fn in FAULTS.items()} == {f: v.replace(".", "_") for f, v in VARIANT_OF.items()}
    assert {f: fn.__name__ for f, fn in device_faults("cpu").items()} == {f: fn.__name__ for f, fn in FAULTS.items()}


@pytest.mark.parametrize("seed", range(N_CASES))
def test_lean_kernels_give_the_catalogue_bits(seed):
    """Each lean kernel, called as a kernel and through from_acc with the exact accumulator formed
    here, equals the catalogue's kernel bit for bit; and again on a second call (the draws served
    from the cache) and after a call at another shape."""
    ops = _operands(seed)
    lean = lean_faults(accumulate, accumulate_bf16_tiles)
    acc = (ops[0].to(torch.float64) @ ops[1].to(torch.float64).T).to(torch.int32)
    other = _operands(seed + 1000)
    for f, fn in FAULTS.items():
        want = _bits(fn(*ops))
        assert torch.equal(_bits(lean[f](*ops)), want), (f, seed)
        lean[f](*other)
        assert torch.equal(_bits(lean[f].from_acc(*ops, acc)), want), (f, seed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_fault_kernels_on_cuda_give_the_definitions_bits():
    """On CUDA the injection's kernels (cuBLASLt accumulator, Triton F6, draws on the device) equal
    the catalogue's (float64 accumulator, F6's torch tile loop, draws on the host) bit for bit, but for
    the payload of a NaN (the NaN-scale rows of seeds 3 and 7)."""
    fast = device_faults("cuda")
    nans = 0
    for seed in range(8):
        ops = _operands(seed)
        for f, fn in FAULTS.items():
            got = fast[f](*(t.cuda() for t in ops)).cpu()
            want = fn(*ops)
            nans += int(torch.isnan(want).sum())
            assert torch.equal(_bits_one_nan(got), _bits_one_nan(want)), (f, seed)
    assert nans > 0  # the NaN-scale case was drawn
