"""Split-K of the Triton W8A8 GEMM at decode M ("decode_splitk"): on the CPU under Triton's
interpreter (conftest.py), on a GPU compiled.

References: kernels.reference.scaled_mm_triton_order (the CI oracle) and the unsplit decode
tile ("decode"), bit for bit, at several split counts (SLOTS varied so split_k cuts K into 1,
some and one split per BLOCK_K slice), K not a multiple of BLOCK_K, extreme int8 operands.
"""

import importlib

import pytest
import torch

pytest.importorskip("triton")

# the module (the package's `scaled_mm` attribute is the function)
mm = importlib.import_module("requant.kernels.triton.scaled_mm")
from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bitwise_equal  # noqa: E402
from tests.kernels.operands import random_operands  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _same(a, b) -> bool:
    return a.shape == b.shape and bitwise_equal(a, b)


@pytest.mark.parametrize("shape", [(1, 200, 1000), (3, 70, 1536), (8, 130, 600), (5, 64, 256)])
def test_split_k_equals_the_oracle_and_the_unsplit_tile(shape, monkeypatch):
    m, n, k = shape
    a, w, s_a, s_w = random_operands(m, n, k, seed=sum(shape), device=DEVICE)
    want = ref.scaled_mm_triton_order(a.cpu(), w.cpu(), s_a.cpu(), s_w.cpu())
    unsplit = mm.scaled_mm(a, w, s_a, s_w, config="decode").cpu()
    assert _same(unsplit, want)
    blocks = -(-k // 256)
    seen, launched = set(), []
    launch = mm._launch.launch
    monkeypatch.setattr(mm._launch, "launch", lambda kernel, *args: launched.append(kernel) or launch(kernel, *args))
    for slots in (1, 2 * mm.SMS, 10**6):  # one split, the production count, one per BLOCK_K slice
        monkeypatch.setattr(mm, "SLOTS", slots)
        splits, _ = mm.split_k(-(-n // 64), k, 256)
        seen.add(splits)
        got = mm.scaled_mm(a, w, s_a, s_w, config="decode_splitk").cpu()
        assert _same(got, want), (slots, splits)
    assert 1 in seen and blocks in seen
    assert launched == [mm._splitk_partial_kernel, mm._splitk_epilogue_kernel] * 3  # the split-K kernels ran


def test_split_k_extreme_operands():
    """Every product at +-2**14 (a = -128 against w = -128 and 127), K = 4 slices + 40: the
    largest int32 partials; the sum of the splits is the exact accumulator."""
    m, n, k = 8, 96, 4 * 256 + 40
    a = torch.full((m, k), -128, dtype=torch.int8)
    w = torch.full((n, k), -128, dtype=torch.int8)
    w[1::2] = 127
    s_a = torch.full((m, 1), 2.0**-20)
    s_w = torch.full((n, 1), 2.0**-6)
    want = ref.scaled_mm_triton_order(a, w, s_a, s_w)
    got = mm.scaled_mm(*(t.to(DEVICE) for t in (a, w, s_a, s_w)), config="decode_splitk").cpu()
    assert mm.split_k(2, k, 256)[0] > 1 and _same(got, want)


def test_config_for_picks_split_k_at_decode_m_only():
    assert mm.config_for(1, 4096) == "decode_splitk"  # 64 column tiles < SMS
    assert mm.config_for(8, 6144) == "decode_splitk"
    assert mm.config_for(8, 24576) == "decode"  # 384 column tiles fill the SMs
    assert mm.config_for(9, 4096) == "decode"
    assert mm.split_k(64, 4096, 256) == (4, 1024)  # 256 programs for o_proj at Qwen3-8B
    assert mm.split_k(64, 12288, 256) == (5, 2560)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (8, 4096, 12288), (4, 6144, 4096), (1, 1024, 4096)])
def test_split_k_on_the_gpu_at_qwen3_8b_decode_shapes(shape):
    """Compiled split-K against the compiled unsplit decode tile and the CPU oracle."""
    m, n, k = shape
    a, w, s_a, s_w = random_operands(m, n, k, seed=m + n, pow2=True, device="cuda")
    assert mm.config_for(m, n) == "decode_splitk"
    got = mm.scaled_mm(a, w, s_a, s_w)
    assert _same(got, mm.scaled_mm(a, w, s_a, s_w, config="decode"))
    assert _same(got.cpu(), ref.scaled_mm_triton_order(a.cpu(), w.cpu(), s_a.cpu(), s_w.cpu()))
