"""Operands shared by the kernel tests (not a test module): seeded random W8A8 GEMM
operands, and activation rows at the bottom of the float range."""

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


def tiny_rows(dtype):
    """Rows the plain IEEE 127 / absmax overflows on (absmax < 127 / FLT_MAX), subnormal
    rows, rows either side of TINY = 2**-64, a zero row and an ordinary row."""
    rows = [
        [1e-37, 0.0, -1e-37, 5e-38, 3e-38, -7.7e-38],  # normal bf16/fp32, inv overflows
        [1.0e-39, -3e-40, 0.0, 2e-40, 9.2e-41, -5e-40],  # bf16/fp32 subnormals
        [2.0**-64, -(2.0**-65), 2.0**-66 * 3, 0.0, 1e-20, -2e-20],  # absmax = TINY: plain path
        [2.0**-64 * 0.99, -(2.0**-65), 2.0**-66 * 3, 0.0, 1e-20, -2e-20],  # just below TINY
        [0.0] * 6,
        [1.0, 2.0, -3.0, 0.5, 126.5, -0.25],
    ]
    if dtype == torch.float32:
        rows.append([1.4e-45, -2.8e-45, 0.0, 7e-45, 1.4e-45, 0.0])  # fp32 denormals: s rounds to 0
    return torch.tensor(rows, dtype=torch.float64).to(dtype)
