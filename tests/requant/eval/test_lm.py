"""The lm-eval model `requant` (requant/eval/lm.py), on the embedded default checkpoint.

Independent references: log-softmax computed here in float64 from the runtime's own logits
(model.logits) on windows built here by hand from the definition (each token predicted
exactly once, first window conditioned on the prefix token, later windows on the tokens
before them); greedy decoding by repeated argmax over model.logits; lm-eval's corpus
formulas recomputed with math.fsum from the logged per-document samples and word/byte
counts taken here with str.split / UTF-8.

Tolerances: the LM takes log_softmax in fp32 (as lm-eval's HF model does) and sums in
float64; the reference is float64 throughout. fp32 log-softmax of logits of magnitude < 10
is off by < 1e-5 per token, so N tokens agree within N * 1e-5 nats; a dropped, repeated or
shifted token moves the sum by about one token's log-probability (~6 nats for this 512-way
model), far outside it.
"""

import math

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")  # the whole file needs lm-eval: skipped, not an error, without it

import requant.eval.lm  # noqa: E402, F401  (registers "requant")
from requant import DEFAULT_CHECKPOINT  # noqa: E402
from requant.eval.lm import RequantLM  # noqa: E402
from requant.eval.task import HELDOUT_TASK, heldout_docs, task_manager  # noqa: E402

TOL_PER_TOKEN = 1e-5


class Req:
    def __init__(self, *args):
        self.args = args


def _logprob_sum(model, inp, targets) -> float:
    """Sum of float64 log-softmax at `targets`, predicted by the last len(targets) rows."""
    lg = model.logits([inp])[0].to(torch.float64)
    lp = torch.log_softmax(lg[-len(targets) :], dim=-1)
    return float(sum(lp[i, t] for i, t in enumerate(targets)))


def _rolling_reference(model, tokens, prefix, L) -> float:
    """Windows from the definition: the first predicts tokens[0:L] from [prefix] + tokens[:L-1];
    each later one predicts the next up-to-L tokens from the L tokens before its last target."""
    total = _logprob_sum(model, [prefix] + tokens[: L - 1], tokens[:L])
    start = L
    while start < len(tokens):
        stop = min(start + L, len(tokens))
        total += _logprob_sum(model, tokens[stop - 1 - L : stop - 1], tokens[start:stop])
        start = stop
    return total


@pytest.fixture(scope="module")
def lm():
    return RequantLM(max_length=64, batch_size=1)


def test_rolling_loglikelihood_equals_direct_log_softmax_over_several_windows(lm):
    text = heldout_docs()[0]["text"][:1150]
    tokens = lm.tok_encode(text)
    assert 4 * lm.max_length < len(tokens) < 5 * lm.max_length  # five windows, the last one partial
    want = _rolling_reference(lm.model, tokens, lm.prefix_token_id, lm.max_length)
    short = "Elinor"
    got = lm.loglikelihood_rolling([Req(text), Req(short), Req("")])
    assert abs(got[0] - want) <= len(tokens) * TOL_PER_TOKEN, (got[0], want)
    short_tokens = lm.tok_encode(short)
    assert (
        abs(got[1] - _logprob_sum(lm.model, [lm.prefix_token_id] + short_tokens[:-1], short_tokens))
        <= 6 * TOL_PER_TOKEN
    )
    assert got[2] == 0.0  # nothing to predict
    assert lm.prefix_token_id == 0  # the default's config bos_token_id (<|endoftext|>)


def test_loglikelihood_and_is_greedy(lm):
    ctx, cont = "Mrs. Dashwood", " was"
    ((ll, greedy),) = lm.loglikelihood([Req(ctx, cont)])
    c, whole = lm.tok_encode(ctx), lm.tok_encode(ctx + cont)
    assert abs(ll - _logprob_sum(lm.model, whole[:-1], whole[len(c) :])) <= 4 * TOL_PER_TOKEN
    argmax = [int(lm.model.logits([whole[:-1]])[0][len(c) - 1 + i].argmax()) for i in range(len(whole) - len(c))]
    assert greedy == (argmax == whole[len(c) :])
    # the model's own argmax continuation (token ids: the random default's argmax is often a
    # special id that no text encodes to) is greedy; change its last token and it is not
    ids = list(c)
    for _ in range(3):
        ids.append(int(lm.model.logits([ids])[0][-1].argmax()))
    other = ids[:-1] + [(ids[-1] + 1) % 512]
    (l1, g1), (l2, g2) = lm._loglikelihood_tokens([(None, c, ids[len(c) :]), (None, c, other[len(c) :])])
    assert g1 is True and g2 is False and l1 > l2
    assert abs(l1 - _logprob_sum(lm.model, ids[:-1], ids[len(c) :])) <= 3 * TOL_PER_TOKEN


def test_generate_until_is_greedy_and_stops(micro):
    """On the micro model, whose 64 ids are all printable bytes here (the random default
    mostly emits special ids that decode to nothing)."""
    lm = RequantLM(pretrained=str(micro))
    prompt = "The family of Dashwood"
    (out,) = lm.generate_until([Req(prompt, {"until": ["\x00never"], "max_gen_toks": 8})])
    ids = lm.tok_encode(prompt)
    new = []
    for _ in range(8):
        t = int(lm.model.logits([ids + new])[0][-1].argmax())
        if t == lm.eot_token_id:
            break
        new.append(t)
    want = bytes(new).decode("utf-8")
    assert out == want and len(want) >= 2
    stop = want[-2:]  # a stop string cuts the text at its first occurrence
    (cut,) = lm.generate_until([Req(prompt, {"until": ["\x00never", stop], "max_gen_toks": 8})])
    assert cut == want[: want.index(stop)]
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([Req(prompt, {"do_sample": True})])


def test_model_args_are_checked():
    with pytest.raises(ValueError, match="unknown model_args"):
        RequantLM(nonsense=1)
    with pytest.raises(ValueError, match="exceeds"):
        RequantLM(max_length=4096)
    with pytest.raises(ValueError, match="batch_size"):
        RequantLM(batch_size="many")


def test_simple_evaluate_heldout_offline_metrics_from_samples():
    """The documented call: simple_evaluate(model="requant", tasks=["requant-heldout"]), with
    the task manager that knows the shipped task; two chapters (the shortest), 128-token windows."""
    res = lm_eval.simple_evaluate(
        model="requant",
        model_args=f"pretrained={DEFAULT_CHECKPOINT},max_length=128,batch_size=4",
        tasks=[HELDOUT_TASK],
        task_manager=task_manager(),
        samples={HELDOUT_TASK: [4, 7]},
        log_samples=True,
        bootstrap_iters=0,
    )
    metrics = res["results"][HELDOUT_TASK]
    samples = sorted(res["samples"][HELDOUT_TASK], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == [4, 7]
    docs = heldout_docs()
    ll = [s["resps"][0][0] for s in samples]
    words = [len(docs[s["doc_id"]]["text"].split()) for s in samples]
    nbytes = [len(docs[s["doc_id"]]["text"].encode("utf-8")) for s in samples]
    total = math.fsum(ll)
    assert metrics["word_perplexity,none"] == pytest.approx(math.exp(-total / sum(words)), rel=1e-12)
    assert metrics["byte_perplexity,none"] == pytest.approx(math.exp(-total / sum(nbytes)), rel=1e-12)
    assert metrics["bits_per_byte,none"] == pytest.approx(-total / sum(nbytes) / math.log(2), rel=1e-12)
    assert all(s["word_perplexity"] == (s["resps"][0][0], w) for s, w in zip(samples, words))
    info = res["config"]["requant"]
    assert info["tokenizer"]["kind"] == "tokenizer.json" and info["max_length"] == 128
    assert info["backend"] == "reference-triton-order"  # the CPU default
    assert all(v < 0 for v in ll)
