"""The engine protocol and the one decode loop (requant/runtime/engine.py).

References: a scripted engine whose rows follow token sequences fixed in advance (the expected
Generation is each sequence cut at its first eos, written out by hand); for the real engines, a
hand-rolled loop of prefill and decode_step.
"""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from requant.runtime import load_model
from requant.runtime.cache import KVCache
from requant.runtime.engine import Decoder, EagerDecoder, Engine, generate

VOCAB = 11
EOS = 7
# row j's token at step s is SEQS[j][s] (whatever was fed back): the loop must stop each row at its
# first EOS, keep stepping rows that are done, and stop when every row is done
SEQS = [
    [3, 4, EOS, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    [5, 5, 5, 5, 5, EOS, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
    [EOS, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
]


def _logits(step: int) -> torch.Tensor:
    out = torch.full((len(SEQS), VOCAB), -1.0)
    for j, seq in enumerate(SEQS):
        out[j, seq[step]] = float(step + 1)  # a distinct value per step: kept logits are checkable
    return out


class ScriptedDecoder:
    def __init__(self, engine, batch, capacity, static_logits, sync_every):
        self.engine = engine
        self.cache = engine.new_cache(batch, capacity)
        self.static_logits = static_logits
        self.sync_every = sync_every
        self.buffer = torch.empty(batch, VOCAB)
        self.steps = 0
        self.fed = []

    def start(self, lengths):
        self.engine.started = list(lengths)

    def step(self, tokens):
        self.fed.append(tokens.tolist())
        self.steps += 1
        if self.static_logits:  # a view of one buffer, overwritten by the next step
            self.buffer.copy_(_logits(self.steps))
            return self.buffer
        return _logits(self.steps)


class ScriptedEngine:
    name = "scripted"

    def __init__(self, static_logits=False, sync_every=1):
        self.static_logits, self.sync_every = static_logits, sync_every
        self.prefills = 0
        self.dec = None

    def new_cache(self, batch, capacity):
        return KVCache(1, batch, 1, capacity, 2, "cpu")

    def prefill(self, prompts, cache=None, capture=None, last_only=False):
        self.prefills += 1
        cache.lengths = [len(p) for p in prompts]
        return _logits(0)

    def extend(self, chunks, cache):
        raise ValueError("not here")

    def decode_step(self, tokens, cache, capture=None):
        raise AssertionError("the loop steps through the decoder")

    def decoder(self, batch, capacity, graphs):
        self.dec = ScriptedDecoder(self, batch, capacity, self.static_logits, self.sync_every)
        return self.dec


PROMPTS = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6])]
CUT = [[3, 4, EOS], [5, 5, 5, 5, 5, EOS], [EOS]]  # SEQS cut at the first EOS, by hand


@pytest.mark.parametrize("sync_every", [1, 2, 3, 16])
@pytest.mark.parametrize("static_logits", [False, True])
def test_rows_stop_at_their_first_eos_and_keep_their_logits(sync_every, static_logits):
    eng = ScriptedEngine(static_logits, sync_every)
    assert isinstance(eng, Engine)
    calls = []

    def choose(step, logits):
        calls.append(step)
        return torch.argmax(logits, -1)

    gen = generate(eng, PROMPTS, 20, eos_id=EOS, keep_logits=True, choose=choose)
    assert gen.ids == CUT
    assert len(gen.step_logits) == 6  # the longest row's steps
    for s, lg in enumerate(gen.step_logits):
        assert torch.equal(lg, _logits(s)), s  # a clone of a static buffer, not the last step's
    assert eng.started == [2, 1, 3]
    assert eng.prefills == 1
    # the fed tokens are the chosen ones, every row every step
    assert eng.dec.fed == [[SEQS[j][s] for j in range(3)] for s in range(eng.dec.steps)]
    # the loop reads the ids every sync_every steps: at most sync_every - 1 steps past the last eos
    assert 5 <= eng.dec.steps <= 5 + sync_every - 1
    if sync_every == 1:
        assert eng.dec.steps == 5
    assert calls == list(range(eng.dec.steps + 1))


def test_without_eos_every_step_runs_and_zero_tokens_run_nothing():
    eng = ScriptedEngine(sync_every=16)
    gen = generate(eng, PROMPTS, 9, keep_logits=False)
    assert gen.ids == [s[:9] for s in SEQS]
    assert gen.step_logits == []
    assert eng.dec.steps == 8  # no step after the last choice
    eng = ScriptedEngine()
    gen = generate(eng, PROMPTS, 0, eos_id=EOS, keep_logits=True)
    assert gen.ids == [[], [], []] and eng.prefills == 0 and eng.dec is None


def test_eos_may_be_a_collection():
    gen = generate(ScriptedEngine(sync_every=4), PROMPTS, 20, eos_id=[EOS, 4])
    assert gen.ids == [[3, 4], [5, 5, 5, 5, 5, EOS], [EOS]]


@pytest.fixture(scope="module")
def native():
    return load_model(DEFAULT_CHECKPOINT, "native", "reference-triton-order", engine="reference")


def test_the_reference_engine_and_its_decoder_are_the_protocol(native):
    assert isinstance(native.impl, Engine)
    dec = native.impl.decoder(2, 16, graphs=True)
    assert isinstance(dec, Decoder) and isinstance(dec, EagerDecoder)
    assert dec.cache.capacity == 16 and len(dec.cache.lengths) == 2


def test_the_loop_on_the_reference_engine_equals_a_hand_rolled_greedy_loop(native):
    """Reference: prefill, then argmax and decode_step by hand (no eos): the same ids and logits."""
    prompts = [[5, 17, 42, 8], [99, 3]]
    gen = native.generate(prompts, 5, keep_logits=True)
    with torch.no_grad():
        cache = native.new_cache(2, 16)
        logits = native.prefill([torch.tensor(p) for p in prompts], cache=cache, last_only=True)
        ids, kept = [[], []], []
        for step in range(5):
            tok = torch.argmax(logits, -1)
            kept.append(logits)
            for j, t in enumerate(tok.tolist()):
                ids[j].append(t)
            if step < 4:
                logits = native.decode_step(tok, cache)
    assert gen.ids == ids
    assert len(gen.step_logits) == 5
    for a, b in zip(gen.step_logits, kept):
        assert torch.equal(a, b)
