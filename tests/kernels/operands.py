"""Seeded random W8A8 operands shared by the kernel tests (not a test module)."""

import torch


def random_operands(m, n, k, seed=0, pow2=False, device="cpu"):
    """int8 a [m, k], int8 w [n, k], fp32 s_a [m, 1], fp32 s_w [n, 1] (powers of two if pow2)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    s_a = (torch.rand(m, 1, generator=g) * 0.05 + 1e-4).float()
    if pow2:
        s_w = torch.ldexp(torch.ones(n, 1), torch.randint(-14, -3, (n, 1), generator=g))
    else:
        s_w = (torch.rand(n, 1, generator=g) * 0.01 + 1e-5).float()
    return [t.to(device) for t in (a, w, s_a, s_w)]
