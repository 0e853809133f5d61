"""GPU tests (marker `gpu`): both kernels on every Linear shape of Qwen3-1.7B, 8B and 14B
at M in {1, 16, 512, 2048, 4096}, bitwise against their emulated orders, and against each
other; every CUTLASS tile (the 64x128 `mid` tile on every Qwen3 shape), and the Triton
backend's cached launches (the first call of a launch key compiles, later ones reuse it).

References: kernels.reference.epilogue_triton_order / epilogue_cutlass_order applied to
kernels.reference.accumulate (exact: float64 matmul of int8 values), computed on the GPU;
kernels.reference.quantize_activations for the shared activation operands.
Run: python3 -m pytest -q -m gpu tests/kernels   (on an sm90 GPU for the CUTLASS half)
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the CUTLASS half needs sm90)", allow_module_level=True)

from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bitwise_equal, is_power_of_two, ulp_distance  # noqa: E402
from requant.kernels.cutlass import TILES  # noqa: E402 (no build at import)
from requant.kernels.triton.scaled_mm import CONFIGS as TRITON_CONFIGS  # noqa: E402
from tests.kernels.operands import random_operands  # noqa: E402

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
MS = [1, 16, 512, 2048, 4096]
# The measured rate of outputs where the two orders differ is ~4 per million (general bf16
# scales); once this many outputs were compared, zero differing outputs would mean the two
# orders were not what they claim to be (expected count >= 40).
RATE_MIN_OUTPUTS = 10**7


@pytest.fixture(scope="module")
def order_mismatch():
    """Differing outputs between the two orders, gathered over the Qwen3 cases; reported
    (and checked) when the module's tests are done, whatever order they ran in."""
    stats = {"outputs": 0, "differ": 0}
    yield stats
    if stats["outputs"]:
        rate = stats["differ"] / stats["outputs"]
        print(
            f"\nCUTLASS vs Triton order, general bf16 scales: {stats['differ']} of "
            f"{stats['outputs']} outputs differ by one spacing ({rate * 1e6:.2f} per million)"
        )
    if stats["outputs"] >= RATE_MIN_OUTPUTS:
        assert stats["differ"] > 0, f"no output differs between the orders over {stats['outputs']} outputs"


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
def test_qwen3_shape(model, lin, n, k, m, order_mismatch):
    from requant.kernels import triton as tk

    x, w, s_w, s_w_pow2 = _operands(m, n, k, seed=m * 7919 + n + k)
    a, s_a = tk.quantize_activations(x)
    a_ref, s_a_ref = ref.quantize_activations(x)
    assert torch.equal(a, a_ref) and bitwise_equal(s_a, s_a_ref), "quantization != reference"
    acc = ref.accumulate(a, w)
    y_t = {}
    for name, sw in (("general", s_w), ("pow2", s_w_pow2)):
        y_t[name] = tk.scaled_mm(a, w, s_a, sw)
        assert bitwise_equal(y_t[name], ref.epilogue_triton_order(acc, s_a, sw)), (
            f"triton != emulated triton order ({name} s_w)"
        )
    if not SM90:
        return
    from requant.kernels import cutlass as ck

    y_c = ck.scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(y_c, ref.epilogue_cutlass_order(acc, s_a, s_w)), "cutlass != emulated cutlass order"
    d = ulp_distance(y_c, y_t["general"])
    assert int(d.max()) <= 1, "orders more than one bf16 spacing apart"
    order_mismatch["outputs"] += d.numel()
    order_mismatch["differ"] += int((d > 0).sum())
    y_c2 = ck.scaled_mm(a, w, s_a, s_w_pow2)
    assert bitwise_equal(y_c2, ref.epilogue_cutlass_order(acc, s_a, s_w_pow2))
    assert bitwise_equal(y_c2, y_t["pow2"]), "CUTLASS != Triton under power-of-two scales"


@needs_sm90
def test_orders_differ_by_exactly_one_spacing_sometimes():
    """Both kernels on one Qwen3-8B gate,up case at M = 2048 (25M outputs, ~100 expected to
    differ at the measured ~4 per million): each equals its emulated order bit for bit, the
    orders differ somewhere (the two emulations are not secretly the same), and every
    difference is exactly one bf16 spacing."""
    from requant.kernels import cutlass as ck
    from requant.kernels import triton as tk

    m, n, k = 2048, 12288, 4096
    x, w, s_w, _ = _operands(m, n, k, seed=20240)
    a, s_a = ref.quantize_activations(x)
    acc = ref.accumulate(a, w)
    y_c = ck.scaled_mm(a, w, s_a, s_w)
    y_t = tk.scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(y_c, ref.epilogue_cutlass_order(acc, s_a, s_w))
    assert bitwise_equal(y_t, ref.epilogue_triton_order(acc, s_a, s_w))
    d = ulp_distance(y_c, y_t)
    differ = int((d > 0).sum())
    print(
        f"\nCUTLASS vs Triton order, {m}x{n}x{k}: {differ} of {d.numel()} outputs differ "
        f"({differ / d.numel() * 1e6:.2f} per million)"
    )
    assert differ > 0, "the two epilogue orders gave identical bits on 25M outputs"
    assert int(d.max()) == 1, "every difference must be exactly one bf16 spacing"


@needs_sm90
@pytest.mark.parametrize("tile", sorted(TILES))
@pytest.mark.parametrize("m", [1, 7, 16, 37, 128, 300, 1500])
def test_cutlass_every_tile_same_bits(tile, m):
    from requant.kernels import cutlass as ck

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
    from requant.kernels import cutlass as ck

    a, w, s_a, s_w = random_operands(1000, 3072, 4096, seed=swizzle, device="cuda")
    assert bitwise_equal(ck.scaled_mm(a, w, s_a, s_w, swizzle=swizzle), ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
@pytest.mark.parametrize("shape", [(33, 100, 200), (1, 12, 40), (5, 8, 0), (0, 8, 16), (4, 0, 16)])
def test_cutlass_unaligned_and_empty(shape):
    from requant.kernels import cutlass as ck

    m, n, k = shape
    a, w, s_a, s_w = random_operands(m, n, k, seed=m + 10 * n + 1000 * k, device="cuda")
    y = ck.scaled_mm(a, w, s_a, s_w)
    assert bitwise_equal(y, ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
def test_cutlass_strided_and_offset_operands():
    from requant.kernels import cutlass as ck

    big, w_big, s_a_big, s_w = random_operands(64, 256, 4096 + 16, seed=31, device="cuda")
    a = big[3:40, 5 : 4096 + 5]  # neither contiguous nor 16-byte aligned: copied
    w = w_big[:, 16:]  # aligned base, row stride 4112: a strided view
    s_a = s_a_big[3:40]
    assert bitwise_equal(ck.scaled_mm(a, w, s_a, s_w), ref.scaled_mm_cutlass_order(a, w, s_a, s_w))


@needs_sm90
@pytest.mark.parametrize("m", [129, 512, 1000])
@pytest.mark.parametrize("model,lin,n,k", CASES)
def test_cutlass_mid_tile_every_qwen3_shape(model, lin, n, k, m):
    """The 64x128 Pingpong tile, forced on every Qwen3 Linear, with the
    scheduler swizzles 1 and 8: bitwise equal to the emulated CUTLASS order."""
    from requant.kernels import cutlass as ck

    mid = {name: t for t, name in TILES.items()}["mid"]
    a, w, s_a, s_w = random_operands(m, n, k, seed=m + n + k, device="cuda")
    want = ref.scaled_mm_cutlass_order(a, w, s_a, s_w)
    for swizzle in (1, 8):
        assert bitwise_equal(ck.scaled_mm(a, w, s_a, s_w, tile=mid, swizzle=swizzle), want), f"swizzle {swizzle}"


@pytest.mark.parametrize("config", sorted(TRITON_CONFIGS))
def test_triton_cached_launches_same_bits(config):
    """Each config: the plain JIT launch (cached=False), then cached launches on fresh
    operands (other addresses, same launch key), then a launch key of its own (a 4-byte
    aligned s_a view, a row-strided a that forces the pointer kernel) and its cached repeat.
    Reference: kernels.reference.scaled_mm_triton_order."""
    from requant.kernels import triton as tk

    m, n, k = 300, 1000, 512
    for i, cached in enumerate([False, True, True, True]):
        a, w, s_a, s_w = random_operands(m, n, k, seed=100 + i, device="cuda")
        got = tk.scaled_mm(a, w, s_a, s_w, config=config, cached=cached)
        assert bitwise_equal(got, ref.scaled_mm_triton_order(a, w, s_a, s_w)), f"call {i} (cached={cached})"
    for i in range(2):
        a_big, w, s_big, s_w = random_operands(m + 1, n, k + 8, seed=200 + i, device="cuda")
        a, s_a = a_big[1:, :k], s_big[1:]  # row stride k + 8 (not 16-aligned), s_a 4-byte aligned
        w = w[:, :k]
        assert s_a.data_ptr() % 16 != 0
        got = tk.scaled_mm(a, w, s_a, s_w, config=config)
        assert bitwise_equal(got, ref.scaled_mm_triton_order(a, w, s_a, s_w)), f"strided call {i}"


@pytest.mark.parametrize("seed", range(4))
def test_triton_quantize_of_row_subsets_gives_the_whole_calls_rows(seed):
    """Per-token quantization is a function of the row alone on the GPU too: the Triton kernel on
    any subset of rows (an MoE expert's tokens, quantized once per layer and sliced: runtime/moe.py)
    gives those rows of the whole call, and the reference's bits. Drawn: widths (Qwen3-MoE's 768 and
    1536, 2048, a non-multiple of 16), rows of every magnitude, zero and tiny (below 2**-64) rows,
    subsets of every size including one row and all rows."""
    from requant.kernels import triton as tk

    g = torch.Generator().manual_seed(seed)
    k = [768, 1536, 2048, 1000][seed]
    m = int(torch.randint(1, 300, (), generator=g))
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-90, 20, (m, 1), generator=g).float())
    x[torch.rand(m, generator=g) < 0.1] = 0
    x = x.to(torch.bfloat16).cuda()
    q, s = tk.quantize_activations(x)
    q_ref, s_ref = ref.quantize_activations(x)
    assert torch.equal(q, q_ref) and bitwise_equal(s, s_ref)
    for size in (1, max(1, m // 7), m // 2 + 1, m):
        rows = torch.randperm(m, generator=g)[:size].sort().values.cuda()
        qs, ss = tk.quantize_activations(x[rows])
        assert torch.equal(qs, q[rows]) and bitwise_equal(ss, s[rows]), (seed, size)


def test_triton_quantize_cached_and_nonfinite_rows():
    """Cached quantization launches equal the reference, and on a GPU the default check
    marks NaN/inf rows without a host sync (s = NaN with POISON_SCALE_BITS, q = 0), exactly
    as the reference does. Reference: kernels.reference.quantize_activations."""
    from requant.kernels import triton as tk

    for i in range(3):
        x = torch.randn(333, 5120, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i)).to(
            torch.bfloat16
        )
        if i == 2:
            x[5, 17] = float("nan")
            x[6, 5000] = float("inf")
        q, s = tk.quantize_activations(x)
        q_ref, s_ref = ref.quantize_activations(x)
        assert torch.equal(q, q_ref) and bitwise_equal(s, s_ref), f"call {i}"
    assert torch.all(s[5:7].view(torch.int32) == ref.POISON_SCALE_BITS) and torch.all(q[5:7] == 0)
    with pytest.raises(ValueError, match="NaN or infinity"):
        tk.quantize_activations(x, check=True)
