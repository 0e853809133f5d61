"""Shared helpers for the audit tests: seeded random W8A8 operands on CPU.

Operands follow the contract of kernels/reference.py: int8 a [M, K] and w [N, K] (w may
hold -128), fp32 s_a [M, 1], fp32 s_w [N, 1] upcast from bf16 (as a checkpoint stores them).
"""

import pytest
import torch

from requant.audit.catalogue.faults import reference_case
from requant.audit.records import Activations, Weights


def make_operands(seed: int, m: int = 24, k: int = 96, n: int = 40, pow2: bool = False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), generator=g).to(torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    s_a = (torch.rand(m, 1, generator=g) * 0.05 + 1e-3).to(torch.float32)
    if pow2:
        s_w = torch.pow(2.0, torch.randint(-14, -6, (n, 1), generator=g).to(torch.float32))
    else:
        s_w = (torch.rand(n, 1, generator=g) * 0.01 + 1e-4).to(torch.bfloat16).to(torch.float32)
    return Activations(a, s_a), Weights(w, s_w)


def make_case(seed: int, pow2: bool = False, **shape):
    act, wt = make_operands(seed, pow2=pow2, **shape)
    return reference_case(f"layer{seed}", "pow2" if pow2 else "native", act, wt)


class one_thread:
    """torch intra-op threads = 1 for the duration (restored after). The audit's tensors
    on the embedded default are small; on a shared 2-core machine, spinning intra-op
    threads made a 7 s audit take 90 s. Scoped to tests/audit only."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def default_audit():
    """One audit of the embedded default with the reference pair (shared by several tests)."""
    from requant import DEFAULT_CHECKPOINT
    from requant.audit.suite import run_audit
    from requant.backends import REFERENCE_PAIR
    from requant.checkpoint import open_checkpoint

    with one_thread():
        return run_audit(open_checkpoint(DEFAULT_CHECKPOINT), REFERENCE_PAIR, 3, "cpu")
