"""GPU tests (marker `gpu`): both kernels on every Linear shape of Qwen3-1.7B, 8B and 14B
at M in {1, 16, 512, 4096}, bitwise against their emulated orders, and against each other.

References: kernels.reference.epilogue_triton_order / epilogue_cutlass_order applied to
kernels.reference.accumulate (exact: float64 matmul of int8 values), computed on the GPU;
kernels.reference.quantize_activations for the shared activation operands.
Run: python3 -m pytest -q -m gpu tests/kernels   (on an sm90 GPU for the CUTLASS half)
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the CUTLASS half needs sm90)", allow_module_level=True)

from kernels import reference as ref  # noqa: E402
from kernels.bf16 import bitwise_equal, is_power_of_two, ulp_distance  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not SM90, reason="the CUTLASS kernel is sm90a only")

# (N, K) of every Linear of each model; q/o, k/v and gate/up share shapes.
QWEN3 = {
    "1.7B": {"q,o": (2048, 2048), "k,v": (1024, 2048), "gate,up": (6144, 2048), "down": (2048, 6144)},
    "8B": {"q,o": (4096, 4096), "k,v": (1024, 4096), "gate,up": (12288, 4096), "down": (4096, 12288)},
    "14B": {"q,o": (5120, 5120), "k,v": (1024, 5120), "gate,up": (17408, 5120), "down": (5120, 17408)},
}
CASES = [(model, lin, n, k) for model, lins in QWEN3.items() for lin, (n, k) in lins.items()]
MS = [1, 16, 512, 4096]
# Differing outputs between the two orders, gathered over all cases (for the log).
MISMATCH = {"outputs": 0, "differ": 0}


def _operands(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    x[:, torch.randint(0, k, (4,), device="cuda", generator=g)] *= 30  # outlier channels
    if m > 2:
        x[1] = 0  # a zero row
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
    w[:, :8] = -128
    # Checkpoint-like scales: bf16 values upcast exactly, and their power-of-two rounding.
    s_w = (torch.rand(n, 1, device="cuda", generator=g) * 4e-3 + 1e-4).to(torch.bfloat16).float()
    _, e = torch.frexp(s_w)
    s_w_pow2 = torch.ldexp(torch.ones_like(s_w), e - 1)  # the power of two <= s_w, exactly
    assert bool(is_power_of_two(s_w_pow2).all())
    return x, w, s_w, s_w_pow2


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("model,lin,n,k", CASES)
def test_qwen3_shape(model, lin, n, k, m):
    from kernels import triton as tk

    x, w, s_w, s_w_pow2 = _operands(m, n, k, seed=m * 7919 + n + k)
    a, s_a = tk.quantize_activations(x)
    a_ref, s_a_ref = ref.quantize_activations(x)
    assert torch.equal(a, a_ref) and bitwise_equal(s_a, s_a_ref), "quantization != reference"
    acc = ref.accumulate(a, w)
    for sw in (s_w, s_w_pow2):
        y_t = tk.scaled_mm(a, w, s_a, sw)
        assert bitwise_equal(y_t, ref.epilogue_triton_order(acc, s_a, sw)), "triton != emulated triton order"
    if not SM90:
        return
    from kernels import cutlass as ck

    y_t = tk.scaled_mm(a, w, s_a, s_w)
    y_c = ck.scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(y_c, ref.epilogue_cutlass_order(acc, s_a, s_w)), "cutlass != emulated cutlass order"
    d = ulp_distance(y_c, y_t)
    assert int(d.max()) <= 1, "orders more than one bf16 spacing apart"
    MISMATCH["outputs"] += d.numel()
    MISMATCH["differ"] += int((d > 0).sum())
    y_c2 = ck.scaled_mm(a, w, s_a, s_w_pow2)
    y_t2 = tk.scaled_mm(a, w, s_a, s_w_pow2)
    assert bitwise_equal(y_c2, ref.epilogue_cutlass_order(acc, s_a, s_w_pow2))
    assert bitwise_equal(y_c2, y_t2), "CUTLASS != Triton under power-of-two scales"


@needs_sm90
def test_zz_report_order_mismatch_rate():
    # Runs last (name order within the module): prints the measured rate into the log.
    if MISMATCH["outputs"]:
        rate = MISMATCH["differ"] / MISMATCH["outputs"]
        print(f"\nCUTLASS vs Triton order, general bf16 scales: {MISMATCH['differ']} of "
              f"{MISMATCH['outputs']} outputs differ by one spacing ({rate * 1e6:.2f} per million)")


@needs_sm90
@pytest.mark.parametrize("tile", range(7))
@pytest.mark.parametrize("m", [1, 7, 16, 37, 128, 300, 1500])
def test_cutlass_every_tile_same_bits(tile, m):
    from kernels import cutlass as ck

    n, k = 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(m + 100 * tile)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda", generator=g)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
    a[0] = -128
    w[0] = -128  # |acc| = 2**25
    s_a = torch.rand(m, 1, device="cuda", generator=g) * 0.05
    s_w = torch.rand(n, 1, device="cuda", generator=g) * 0.01
    y = ck.scaled_mm(a, w, s_a, s_w, tile=tile)
    assert bitwise_equal(y, ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
@pytest.mark.parametrize("swizzle", [2, 4, 8])
def test_cutlass_swizzle_same_bits(swizzle):
    from kernels import cutlass as ck

    a = torch.randint(-128, 128, (1000, 4096), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (3072, 4096), dtype=torch.int8, device="cuda")
    s_a = torch.rand(1000, 1, device="cuda") * 0.05
    s_w = torch.rand(3072, 1, device="cuda") * 0.01
    assert bitwise_equal(ck.scaled_mm(a, w, s_a, s_w, swizzle=swizzle), ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
@pytest.mark.parametrize("shape", [(33, 100, 200), (1, 12, 40), (5, 8, 0), (0, 8, 16), (4, 0, 16)])
def test_cutlass_unaligned_and_empty(shape):
    from kernels import cutlass as ck

    m, n, k = shape
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s_a = torch.rand(m, 1, device="cuda") * 0.05
    s_w = torch.rand(n, 1, device="cuda") * 0.01
    y = ck.scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(y, ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
def test_cutlass_strided_and_offset_operands():
    from kernels import cutlass as ck

    big = torch.randint(-128, 128, (64, 4096 + 16), dtype=torch.int8, device="cuda")
    a = big[3:40, 5:4096 + 5]  # neither contiguous nor 16-byte aligned: copied
    w = torch.randint(-128, 128, (256, 4096), dtype=torch.int8, device="cuda")
    s_a = torch.rand(37, 1, device="cuda")
    s_w = torch.rand(256, 1, device="cuda") * 0.01
    assert bitwise_equal(ck.scaled_mm(a, w, s_a, s_w), ref.scaled_mm_cutlass_order(a, w, s_a, s_w))
