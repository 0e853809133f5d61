"""The invariance procedure (requant/runtime/invariance.py) on the CPU: the fast engine's Triton
kernels under TRITON_INTERPRET=1 (set here before Triton is imported, as test_fast.py does) on the
micro checkpoint.

References, each independent of the procedure:
  * the comparisons against hand-made tensors whose first differing bit is placed by the test
    (-0 against +0, one flipped last bit), and torch.equal on integer views;
  * the chunked / decoded path against the sequence prefilled whole (Model.logits), bit for bit;
  * negative: a Model whose decode_step, prefill or generate flips the last bit of one logit (a
    monkeypatch at a position the test chooses) is reported as differing there, and only there.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # on a GPU machine, Triton compiles (and these tests skip)
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch

if not _launch.INTERPRET:
    pytest.skip(
        "Triton was imported without TRITON_INTERPRET=1 (the GPU tests run the procedure)",
        allow_module_level=True,
    )

from requant.runtime import invariance


def hexbits(t: torch.Tensor, index) -> str:
    """The fp32 t[index]'s bits as the verdicts write them."""
    return f"0x{int(t.view(torch.int32)[index]) & 0xFFFFFFFF:08x}"


def flip_last_bit(t: torch.Tensor, index) -> torch.Tensor:
    """A copy of fp32 `t` with the lowest mantissa bit of t[index] flipped."""
    out = t.clone()
    out.view(torch.int32)[index] ^= 1
    return out


@pytest.fixture(scope="module")
def seq_and_whole(micro_fast):
    """15 ids and their logits prefilled whole (the reference path, Model.logits)."""
    seq = torch.randint(0, micro_fast.arch.vocab, (15,), generator=torch.Generator().manual_seed(5))
    return seq, micro_fast.logits([seq])[0]


PLAN = invariance.pieces(15, 2, (1, 3, 7))  # positions 0-1, 2, 3-5, 6-12 extended; 13, 14 decoded


def test_comparisons_are_bitwise_and_name_the_first_difference():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(5, 7, generator=g)
    assert invariance.compare_positions("x", want.clone(), want).ok
    got = flip_last_bit(flip_last_bit(want, (3, 4)), (4, 0))
    v = invariance.compare_positions("x", got, want)
    assert not v.ok and (v.compared, v.identical) == (5, 3)
    assert v.first["position"] == 3 and v.first["logit"] == 4
    assert v.first["got"] == hexbits(got, (3, 4)) and v.first["want"] == hexbits(want, (3, 4))
    zero = torch.zeros(2, 3)
    v = invariance.compare_positions("signed zero", zero.clone().neg_(), zero)  # -0 == +0 as floats
    assert torch.equal(-zero, zero) and not v.ok and v.first["position"] == 0 and v.first["got"] == "0x80000000"
    nan = torch.full((1, 2), float("nan"))
    assert invariance.compare_positions("same NaN", nan.clone(), nan).ok
    v = invariance.compare_positions("shape", want[:4], want)
    assert not v.ok and v.identical == 0 and "shape" in v.first
    v = invariance.compare_items("items", [want[:2], flip_last_bit(want[2:], (1, 6))], [want[:2], want[2:]])
    assert (v.compared, v.identical) == (2, 1) and v.first == {
        "prompt": 1,
        "position": 1,
        "logit": 6,
        "got": hexbits(flip_last_bit(want, (3, 6)), (3, 6)),
        "want": hexbits(want, (3, 6)),
    }


def test_pieces_cover_the_sequence():
    assert PLAN == [("extend", 2), ("extend", 1), ("extend", 3), ("extend", 7), ("decode", 2)]
    with pytest.raises(ValueError, match="prefix"):
        invariance.pieces(5, 2, (1, 3))


def test_chunks_and_decode_equal_the_whole_prefill(micro_fast, seq_and_whole):
    seq, whole = seq_and_whole
    got = invariance.piecewise_logits(micro_fast, seq, PLAN, 32)
    assert torch.equal(got.view(torch.int32), whole.view(torch.int32))
    v = invariance.compare_positions("prefill == chunks == decode", got, whole)
    assert v.ok and (v.compared, v.identical, v.first) == (15, 15, None)
    assert invariance.prefill_chunks_decode(micro_fast, seq, PLAN, 32).ok
    with pytest.raises(ValueError, match="covers 14 of 15"):
        invariance.piecewise_logits(micro_fast, seq, PLAN[:-1] + [("decode", 1)], 32)


def test_a_perturbed_decode_step_is_reported_at_its_position(micro_fast, seq_and_whole, monkeypatch):
    """The second decode step (position 14) returns its logits with logit 5's last bit flipped."""
    seq, whole = seq_and_whole
    real = micro_fast.decode_step
    calls = []

    def flipped(tokens, cache, capture=None):
        out = real(tokens, cache, capture=capture)
        calls.append(cache.lengths[0])
        return flip_last_bit(out, (0, 5)) if len(calls) == 2 else out

    monkeypatch.setattr(micro_fast, "decode_step", flipped)
    v = invariance.prefill_chunks_decode(micro_fast, seq, PLAN, 32)
    assert calls == [14, 15]  # the decoded positions 13 and 14 (the cache length after each)
    assert not v.ok and (v.compared, v.identical) == (15, 14)
    assert (v.first["position"], v.first["logit"]) == (14, 5)
    assert v.first["want"] == hexbits(whole, (14, 5))
    assert int(v.first["got"], 16) == int(v.first["want"], 16) ^ 1


def test_alone_and_batch_and_a_perturbed_alone_prefill(micro_fast, monkeypatch):
    m = micro_fast
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, m.arch.vocab, (n,), generator=g) for n in (7, 1, 3)]
    batch = m.logits(prompts)
    v = invariance.compare_items("alone == batch", invariance.alone_rows(m, prompts), batch)
    assert v.ok and v.compared == 3
    assert invariance.alone_vs_batch_prefill(m, prompts).ok
    real = m.prefill

    def flipped(ps, cache=None, capture=None, last_only=False):
        out = real(ps, cache=cache, capture=capture, last_only=last_only)
        return flip_last_bit(out, (2, 9)) if len(ps) == 1 and len(ps[0]) == 3 else out

    monkeypatch.setattr(m, "prefill", flipped)
    v = invariance.alone_vs_batch_prefill(m, prompts)
    assert (v.compared, v.identical) == (3, 2)
    assert (v.first["prompt"], v.first["position"], v.first["logit"]) == (2, 2, 9)


def test_generations_alone_batch_graph_eager_and_a_perturbed_step(micro_fast, monkeypatch):
    m = micro_fast
    prompts = [[3, 4, 5], [7, 8], [9]]
    batch = m.generate(prompts, 3, keep_logits=True)
    v = invariance.alone_vs_batch_decode(m, prompts, 3, (0, 2), batch=batch)
    assert v.ok and v.compared == 2
    v, graphed = invariance.graph_vs_eager(m, prompts, 3)
    assert v.ok and v.compared == 3 and v.ids == (3, 3) and graphed.ids == batch.ids
    real = m.generate

    def flipped(ps, max_new_tokens=64, eos_id=None, keep_logits=False, graphs=True, choose=None):
        out = real(ps, max_new_tokens, eos_id, keep_logits, graphs, choose)
        if graphs and len(ps) == 3:
            out.step_logits[1] = flip_last_bit(out.step_logits[1], (2, 11))
        return out

    monkeypatch.setattr(m, "generate", flipped)
    v, _ = invariance.graph_vs_eager(m, prompts, 3)
    assert not v.ok and (v.compared, v.identical) == (3, 2) and v.ids == (3, 3)
    assert (v.first["step"], v.first["prompt"], v.first["logit"]) == (1, 2, 11)
    v = invariance.alone_vs_batch_decode(m, prompts, 3, (0, 2), batch=m.generate(prompts, 3, keep_logits=True))
    assert (v.compared, v.identical) == (2, 1) and (v.first["prompt"], v.first["step"], v.first["logit"]) == (2, 1, 11)
    # ids differing with equal logits are reported too
    other = real(prompts, 3, keep_logits=True)
    other.ids[1] = [0] + other.ids[1][1:]
    v = invariance.compare_generations("ids", other, batch)
    assert not v.ok and v.identical == 3 and v.ids == (2, 3) and v.first["prompt"] == 1


def test_check_runs_every_check(micro_fast):
    m = micro_fast
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, m.arch.vocab, (n,), generator=g) for n in (5, 1, 9)]
    seq = torch.randint(0, m.arch.vocab, (12,), generator=g)
    got = invariance.check(m, prompts, seq, invariance.pieces(12, 3, (1, 3)), 16, 2, (0,))
    assert set(got) == {"graph_vs_eager", "prefill_chunks_decode", "alone_vs_batch_prefill", "alone_vs_batch_decode"}
    assert all(v.ok for v in got.values()), [str(v) for v in got.values()]
    assert got["prefill_chunks_decode"].compared == 12 and got["alone_vs_batch_prefill"].compared == 3
