"""The fast engine on Qwen3-MoE (runtime/fast_moe.py), on the CPU: its Triton kernels under
TRITON_INTERPRET=1 (set before Triton is imported, as tests/requant/runtime/test_fast.py does).

References, each independent of the code under test:
  * the sparse block against a restatement one token at a time (the grouping of tokens per
    expert cannot matter) from the kernels' emulations: reference-triton-order GEMMs,
    kernels.emulation.silu_mul_quantize_ref, kernels.reference.quantize_activations, and the
    combine of docs/moe.md step 5 written out; the router is runtime/moe.py's (the contract the
    reference engine shares, tested in test_moe.py); hidden states from a seeded generator, token
    counts 1 to 13;
  * the model (tiny-moe): alone == batched and prefill chunks == decode, bit for bit; the same
    Linears captured with the same rows as the reference engine; close to the reference engine's
    logits (the fused kernels' RMSNorm and SiLU are not the reference engine's, as for dense).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch

if not _launch.INTERPRET:
    pytest.skip(
        "Triton was imported without TRITON_INTERPRET=1 (a GPU runs benchmarks/gpu_moe.sh)", allow_module_level=True
    )

from requant import kernels
from requant.checkpoint.synthetic import generate
from requant.kernels.bf16 import bitwise_equal
from requant.kernels.emulation import silu_mul_quantize_ref
from requant.kernels.fused_moe import VLLM_MOE
from requant.kernels.reference import quantize_activations
from requant.runtime import load_model
from requant.runtime.fast_moe import sparse_block
from requant.runtime.moe import route

PROMPTS = [[256, 72, 101, 108, 108, 111], [84, 104, 101], [97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107]]


@pytest.fixture(scope="module")
def fast_moe(tmp_path_factory):
    ck = generate("tiny-moe", tmp_path_factory.mktemp("moe") / "m", seed=3)
    m = load_model(ck, engine="fast")
    assert m.engine == "fast"
    return m


def _one_token(m, i: int, x: torch.Tensor) -> torch.Tensor:
    """Layer i's block output for one token x bf16 [1, hidden] (module docstring)."""
    p, lin = f"model.layers.{i}.mlp.", m.linears
    ids, w = route(x, m.dense[p + "gate.weight"], m.arch.top_k, m.arch.norm_topk_prob)

    def gemm(a, sa, name):
        return kernels.scaled_mm(a, lin[name][0], sa, lin[name][1], backend="reference-triton-order")

    acc = torch.zeros(1, x.shape[1], dtype=torch.float32)
    q, s = quantize_activations(x)
    for slot in sorted(range(ids.shape[1]), key=lambda j: int(ids[0, j])):
        ex = f"{p}experts.{int(ids[0, slot])}."
        qm, sm = silu_mul_quantize_ref(torch.cat([gemm(q, s, ex + "gate_proj"), gemm(q, s, ex + "up_proj")], dim=1))
        acc += gemm(qm, sm, ex + "down_proj").to(torch.float32) * w[0, slot]
    return acc.to(torch.bfloat16)


def test_sparse_block_equals_its_restatement(fast_moe):
    m = fast_moe
    eng, i = m.impl, m.arch.moe_layers()[0]
    layer = eng.layout.layers[i]
    g = torch.Generator().manual_seed(41)

    def mm(q, s, ws, names):
        return eng.ops.scaled_mm(q, ws[0], s, ws[1], m.backend)

    for t in (1, 2, 13):
        h = (torch.randn(t, m.arch.hidden, generator=g) * 2.0 ** torch.randint(-3, 3, (t, 1), generator=g)).to(
            torch.bfloat16
        )
        h[0] = h[-1]  # a repeated row: the same route and bits
        q8, s8 = quantize_activations(h)
        got = sparse_block(eng, layer["moe"], h, q8, s8, mm)
        want = torch.cat([_one_token(m, i, h[r : r + 1]) for r in range(t)])
        assert bitwise_equal(got, want), t


def test_alone_equals_batched_and_close_to_the_reference(fast_moe):
    m = fast_moe
    batch = m.logits(PROMPTS)
    assert all(bitwise_equal(m.logits([p])[0], batch[i]) for i, p in enumerate(PROMPTS))
    gen = m.generate(PROMPTS, 3, keep_logits=True)
    alone = m.generate([PROMPTS[2]], 3, keep_logits=True)
    assert alone.ids[0] == gen.ids[2] and all(
        bitwise_equal(alone.step_logits[s][0], gen.step_logits[s][2]) for s in range(3)
    )
    ref = m.with_backends(engine="reference").logits(PROMPTS)
    o, r = torch.cat(batch), torch.cat(ref)
    assert float((o - r).pow(2).mean().sqrt() / r.std()) <= 0.05
    assert float((o.argmax(-1) == r.argmax(-1)).float().mean()) >= 0.9


def test_prefill_chunks_and_decode_give_the_same_logits(fast_moe):
    m = fast_moe
    seq = torch.tensor(PROMPTS[2] + PROMPTS[0])
    whole = m.logits([seq])[0]
    cache = m.new_cache(1, 32)
    parts = [m.extend([seq[:5]], cache), m.extend([seq[5:12]], cache)]
    parts += [m.decode_step(seq[j : j + 1], cache) for j in range(12, len(seq))]
    assert bitwise_equal(torch.cat(parts), whole)


class _Rows:
    def __init__(self):
        self.rows = {}

    def record(self, names, q, s):
        for n in names:
            self.rows[n] = self.rows.get(n, 0) + q.shape[0]


def test_capture_and_refusals(fast_moe):
    """The fast engine records the reference engine's Linears with the same rows (the tokens the
    router sent each expert); the vLLM MoE backend is refused by name; engine='auto' keeps the
    reference engine for an MoE model."""
    m = fast_moe
    rf, rr = _Rows(), _Rows()
    m.logits(PROMPTS, capture=rf)
    m.with_backends(engine="reference").logits(PROMPTS, capture=rr)
    assert rf.rows == rr.rows and any(".experts." in n for n in rf.rows)
    with pytest.raises(ValueError, match=f"backend {VLLM_MOE} runs on the reference engine"):
        m.with_backends(backend=VLLM_MOE).logits(PROMPTS[:1])
    assert m.with_backends(engine="auto").engine == "reference"
