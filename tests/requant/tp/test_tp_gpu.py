"""The tensor-parallel runtime under NCCL, one GPU per rank (two GPUs needed; skipped
elsewhere): TP 2 against TP 1, and TP 1 against requant.runtime's single-GPU Model with
the same real kernel (cutlass, triton), bit for bit. Not run in CI (no GPU there)."""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from requant.prompts import prompts
from requant.runtime import load_model
from requant.tp import Run, Spec, compare, run
from requant.tp.compare import bits_equal

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

NEW = 16
RUNS = tuple(Run(b, g, "int32", "triton") for b in ("cutlass", "triton") for g in ("native", "pow2"))


@pytest.fixture(scope="module")
def ids():
    m = load_model(DEFAULT_CHECKPOINT)
    return tuple(tuple(m.tokenizer.encode(p)) for p in prompts(4))


@pytest.fixture(scope="module")
def results(ids):
    return run(Spec(str(DEFAULT_CHECKPOINT), ids, degrees=(1, 2), runs=RUNS + (Run("cutlass", "native", "bf16", "triton"),),
                    new_tokens=NEW, device="cuda"), timeout_s=280)


@pytest.mark.parametrize("r", RUNS, ids=lambda r: f"{r.backend}-{r.regime}")
def test_tp2_is_bitwise_tp1_under_nccl(results, r):
    assert compare(results[(r, 1)], results[(r, 2)])["identical"]


@pytest.mark.parametrize("r", RUNS, ids=lambda r: f"{r.backend}-{r.regime}")
def test_tp1_is_the_single_gpu_runtime(results, ids, r):
    m = load_model(DEFAULT_CHECKPOINT, regime=r.regime, backend=r.backend, act_backend=r.act_backend, device="cuda")
    gen = m.generate([list(p) for p in ids], NEW, keep_logits=True)
    want = m.logits([list(p) for p in ids])
    got = results[(r, 1)]
    assert all(bits_equal(a.cpu().to(torch.bfloat16), b) for a, b in zip(want, got.logits))
    assert got.ids == gen.ids
    assert all(bits_equal(a.cpu().to(torch.bfloat16), b) for a, b in zip(gen.step_logits, got.steps))


def test_bf16_reduce_tp1_is_the_int32_bits(results):
    # at one rank nothing is summed: the two reductions agree; TP 2's bf16 result is reported by tp-check
    assert compare(results[(RUNS[0], 1)], results[(Run("cutlass", "native", "bf16", "triton"), 1)])["identical"]
