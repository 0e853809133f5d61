"""The tensor-parallel runtime with the real kernels (cutlass, triton) on GPUs, bit for bit
against TP 1 (the independent reference is the unsharded computation at TP 1): through gloo
with every rank on the one GPU there is (TP 1, 2, 4), and under NCCL with one GPU per rank
(TP 2; two GPUs needed). Not run in CI (no GPU there)."""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from requant.models.prompts import prompts
from requant.runtime import load_model
from requant.tp import LaunchConfig, Spec, compare, run

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NEW = 16
RUNS = tuple(LaunchConfig(b, g, "int32", "triton") for b in ("cutlass", "triton") for g in ("native", "pow2"))


@pytest.fixture(scope="module")
def ids():
    m = load_model(DEFAULT_CHECKPOINT)
    return tuple(tuple(m.tokenizer.encode(p)) for p in prompts(4))


@pytest.fixture(scope="module")
def results(ids):
    return run(
        Spec(
            str(DEFAULT_CHECKPOINT),
            ids,
            degrees=(1, 2),
            runs=RUNS + (LaunchConfig("cutlass", "native", "bf16", "triton"),),
            new_tokens=NEW,
            device="cuda",
        ),
        timeout_s=280,
    )


@pytest.fixture(scope="module")
def gloo_results(ids):
    return run(
        Spec(str(DEFAULT_CHECKPOINT), ids, degrees=(1, 2, 4), runs=RUNS, new_tokens=NEW, device="cuda", comm="gloo"),
        timeout_s=280,
    )


@one_gpu
@pytest.mark.parametrize("r", RUNS, ids=lambda r: f"{r.backend}-{r.regime}")
def test_tp2_and_tp4_are_bitwise_tp1_through_gloo_on_one_gpu(gloo_results, r):
    for d in (2, 4):
        assert compare(gloo_results[(r, 1)], gloo_results[(r, d)])["identical"], d


@one_gpu
def test_pow2_cutlass_equals_triton_at_every_degree(gloo_results):
    for d in (1, 2, 4):
        a, b = gloo_results[(RUNS[1], d)], gloo_results[(RUNS[3], d)]  # cutlass-pow2, triton-pow2
        assert compare(a, b)["identical"], d


@two_gpus
@pytest.mark.parametrize("r", RUNS, ids=lambda r: f"{r.backend}-{r.regime}")
def test_tp2_is_bitwise_tp1_under_nccl(results, r):
    assert compare(results[(r, 1)], results[(r, 2)])["identical"]


@two_gpus
def test_bf16_reduce_tp1_is_the_int32_bits(results):
    # at one rank nothing is summed: the two reductions agree; TP 2's bf16 result is reported by tp-check
    assert compare(results[(RUNS[0], 1)], results[(LaunchConfig("cutlass", "native", "bf16", "triton"), 1)])[
        "identical"
    ]
