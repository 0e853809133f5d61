"""The runtime's front (requant/runtime/model.py) and the engine contracts, on the reference
engine of the micro checkpoint (CPU; the fast engine's side: test_fast.py).

References, per test: decode_step's capture against the operands that kernels.scaled_mm
itself received (a spy around it) and against kernels.reference.quantize_activations of
the recorded Linear's input; generate(choose=...) against the argmax path and against the
choice recomputed from the kept logits; the cache rule against pow2_at_least; TP's generate
against the Model's (tests/requant/tp/ compares the degrees).
"""

import pytest
import torch

from requant import kernels
from requant.checkpoint.synthetic import generate
from requant.kernels.bf16 import bitwise_equal
from requant.runtime import Generation, load_model
from requant.runtime.cache import generation_capacity, pow2_at_least
from requant.runtime.reference import ReferenceEngine
from tests.requant.conftest import MICRO


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    path = generate(MICRO, tmp_path_factory.mktemp("micro") / "micro", seed=1)
    return load_model(path, regime="pow2")


class Recorder:
    def __init__(self):
        self.records = []

    def record(self, names, q, s):
        self.records.append((names, q, s))


@pytest.fixture
def gemm_spy(monkeypatch):
    """Every (a, s_a) kernels.scaled_mm receives, in call order (the call itself unchanged)."""
    seen = []
    real = kernels.scaled_mm

    def spy(a, w, s_a, s_w, *args, **kw):
        seen.append((a, s_a, w))
        return real(a, w, s_a, s_w, *args, **kw)

    monkeypatch.setattr(kernels, "scaled_mm", spy)
    return seen


def _groups(arch, lm_head: bool):
    out = []
    for i in range(arch.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"),
            (p + "self_attn.o_proj",),
            (p + "mlp.gate_proj", p + "mlp.up_proj"),
            (p + "mlp.down_proj",),
        ]
    return out + ([("lm_head",)] if lm_head else [])


def test_engine_is_chosen_once(micro_model):
    m = micro_model
    assert m.engine == "reference" and isinstance(m.impl, ReferenceEngine) and m.impl.model is m
    c = m.with_backends("reference-cutlass-order")
    assert c.engine == "reference" and c.impl.model is c and c.linears is m.linears
    assert c.impl.linears.model is c  # the copy's Linears read the copy's backend
    with pytest.raises(ValueError, match="engine must be one of"):
        m.with_backends(engine="turbo")
    with pytest.raises(ValueError, match="extend needs the fast engine"):
        m.extend([[1, 2]], m.new_cache(1, 8))


def test_decode_step_capture_records_what_the_gemms_consumed(micro_model, gemm_spy):
    m = micro_model
    prompts = [torch.tensor([3, 4, 5, 6]), torch.tensor([7])]
    cache = m.new_cache(2, 8)
    with torch.no_grad():
        m.prefill(prompts, cache=cache)
        gemm_spy.clear()
        rec = Recorder()
        logits = m.decode_step(torch.tensor([9, 10]), cache, capture=rec)
    assert [r[0] for r in rec.records] == _groups(m.arch, "lm_head" in m.linears)
    consumed = iter(gemm_spy)
    for names, q, s in rec.records:
        assert q.dtype == torch.int8 and q.shape[0] == 2 and s.dtype == torch.float32 and s.shape == (2, 1)
        for n in names:  # one scaled_mm per quantized name, on the recorded operands
            a, s_a, w = next(consumed)
            assert a is q and s_a is s and w is m.linears[n][0]
    assert next(consumed, None) is None
    # the same step without capture: the same bits
    cache2 = m.new_cache(2, 8)
    with torch.no_grad():
        m.prefill(prompts, cache=cache2)
        assert bitwise_equal(m.decode_step(torch.tensor([9, 10]), cache2), logits)


def test_choose_replaces_the_argmax(micro_model):
    m = micro_model
    prompts = [[3, 4, 5], [7, 8], [1]]
    calls = []

    def argmax(step, logits):
        calls.append((step, tuple(logits.shape)))
        return torch.argmax(logits, dim=-1)

    plain = m.generate(prompts, 5, keep_logits=True)
    same = m.generate(prompts, 5, keep_logits=True, choose=argmax)
    assert same.ids == plain.ids and all(bitwise_equal(a, b) for a, b in zip(same.step_logits, plain.step_logits))
    assert calls == [(s, (3, m.arch.vocab)) for s in range(5)]  # once per step, every row

    def second_best(step, logits):
        return torch.topk(logits, 2, dim=-1).indices[:, 1]

    g = m.generate(prompts, 4, keep_logits=True, choose=second_best)
    for s, lg in enumerate(g.step_logits):
        assert [row[s] for row in g.ids] == torch.topk(lg, 2, dim=-1).indices[:, 1].tolist()


def test_one_cache_rule_and_one_generation(micro_model):
    m = micro_model
    assert m.new_cache(2, 9).capacity == 9  # exactly what is asked
    assert generation_capacity(9) == pow2_at_least(9) == 16 and generation_capacity(16) == 16
    g = m.generate([[3, 4]], 2)
    assert isinstance(g, Generation) and len(g.ids[0]) == 2


def test_tp_generate_is_the_models(micro_model):
    """TP 1 (requant.tp's ShardedModel on one rank) runs the reference engine's code: the same
    Generation, bit for bit."""
    from requant.tp.engine import Comm, ShardedModel

    m = micro_model
    tp = ShardedModel.build(m.config, m.dense, m.linears, Comm(None))
    prompts = [[3, 4, 5], [7]]
    a = tp.generate(prompts, 4)
    b = m.generate(prompts, 4, keep_logits=True)
    assert isinstance(a, Generation) and a.ids == b.ids
    assert all(bitwise_equal(x, y) for x, y in zip(a.step_logits, b.step_logits))
