"""The portable engine on the CPU: its torch form (kernels="torch", the specification) against its
Triton kernels under TRITON_INTERPRET=1 (kernels="triton", what a GPU compiles), end to end, bit
for bit (int32 views of the fp32 logits, the sampled tokens and their digests).

References, each independent of the side under test: the Triton engine for the torch engine and
conversely (two implementations in two languages of the same operations); the same engine's
whole-sequence prefill for its chunked prefill and decode; a prompt alone for its row of a batch;
and the reference engine for closeness (a different arithmetic: a bound, not bits).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch

if not _launch.INTERPRET:
    pytest.skip("Triton was imported without TRITON_INTERPRET=1", allow_module_level=True)

import requant.kernels.portable as spec
from requant import DEFAULT_CHECKPOINT
from requant.runtime import load_model
from requant.runtime.portable import with_kernels
from requant.runtime.sampling import SamplingParams, generate


def same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    from requant.checkpoint.synthetic import generate as synth
    from tests.requant.conftest import MICRO

    path = synth(MICRO, tmp_path_factory.mktemp("micro") / "micro", seed=1)
    m = load_model(path, regime="pow2", engine="portable")
    return m, with_kernels(m, "triton")


def _prompts(vocab, lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def test_engine_choice(micro):
    cpu, tri = micro
    assert (cpu.engine, cpu.impl.kernels, tri.impl.kernels) == ("portable", "torch", "triton")
    assert cpu.with_backends(backend="reference-cutlass-order").engine == "portable"


@pytest.mark.parametrize("tokens", [None, 3])
def test_torch_equals_triton_across_a_split_boundary_batched(micro, monkeypatch, tokens):
    from requant.kernels.triton import portable as tp

    monkeypatch.setattr(spec, "SPLIT", 16)  # both forms read it at each call: splits at 16, 32
    monkeypatch.setattr(tp, "PREFILL_TOKENS", tokens)  # the Triton attention's tokens per prefill program
    cpu, tri = micro
    prompts = _prompts(cpu.arch.vocab, (19, 3))
    a = cpu.generate(prompts, 4, keep_logits=True)
    b = tri.generate(prompts, 4, keep_logits=True)
    assert a.ids == b.ids
    assert all(same(x, y) for x, y in zip(a.step_logits, b.step_logits))
    alone = cpu.generate(prompts[1:], 4, keep_logits=True)  # a prompt alone == its row of the batch
    assert alone.ids[0] == a.ids[1]
    assert all(same(x[0], y[1]) for x, y in zip(alone.step_logits, a.step_logits))


def test_prefill_chunks_and_decode_are_the_same_bits(micro, monkeypatch):
    monkeypatch.setattr(spec, "SPLIT", 16)
    cpu, _ = micro
    seq = _prompts(cpu.arch.vocab, (21,), seed=7)[0]
    whole = cpu.logits([seq])[0]
    cache = cpu.new_cache(1, 32)
    parts = [cpu.extend([seq[:5]], cache), cpu.extend([seq[5:17]], cache)]
    parts += [cpu.decode_step(seq[i : i + 1], cache) for i in range(17, 21)]
    assert same(torch.cat(parts), whole)
    ref = load_model(cpu.path, regime="pow2", engine="reference").logits([seq])[0]
    assert (ref - whole).abs().max() <= 0.05 * ref.abs().max()


def test_default_sampled_and_greedy_in_a_batch_torch_equals_triton():
    cpu = load_model(DEFAULT_CHECKPOINT, regime="native", engine="portable")
    tri = with_kernels(cpu.with_backends(backend="triton"), "triton")
    ids = [cpu.tokenizer.encode("To bake bread,"), cpu.tokenizer.encode("The sea")]
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=3), SamplingParams()]
    a = generate(cpu, ids, params, 3)
    b = generate(tri, ids, params, 3)
    for x, y in zip(a, b):
        assert x.ids == y.ids
        assert [s.logits_sha256 for s in x.steps] == [s.logits_sha256 for s in y.steps]
        assert [s.logprob for s in x.steps] == [s.logprob for s in y.steps]


def test_exact_accumulate_equals_the_float64_accumulator_and_falls_back(monkeypatch):
    from requant.kernels.reference import accumulate
    from requant.runtime import portable

    g = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (5, 96), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (40, 96), generator=g, dtype=torch.int8)
    a[0], w[0] = -128, -128  # the largest products
    assert torch.equal(portable.exact_accumulate(a, w), accumulate(a, w))
    real = torch._int_mm

    def wrong(x, y):  # one element off: the check must catch it and take the exact path
        out = real(x, y)
        out[2, 7] += 1
        return out

    monkeypatch.setattr(torch, "_int_mm", wrong)
    assert torch.equal(portable.exact_accumulate(a, w), accumulate(a, w))
