"""audit/phases/decode.py: the decode phase on the embedded default, reference pair.

Independent references: the runtime's own greedy decoding (Model.greedy) for the tokens the
capture decodes; the prefill-only audit (conftest.default_audit) for the prefill keys, which the
decode phase must leave exactly as they were.
"""

import torch

from requant import DEFAULT_CHECKPOINT
from requant.audit.phases.decode import batch_prompts, decode_operands
from requant.audit.suite import run_audit
from requant.backends import REFERENCE_PAIR
from requant.checkpoint import open_checkpoint
from requant.models.prompts import prompts
from requant.runtime import load_model

PREFILL_KEYS = ("per_layer", "per_layer_summary", "cells", "scorecard", "detection", "baseline", "end_to_end")


def _tokens(model, n):
    return [model.tokenizer.encode(t) for t in prompts(n)]


def test_decode_phase_audits_each_step_at_its_batch_size(default_audit):
    res = run_audit(
        open_checkpoint(DEFAULT_CHECKPOINT),
        REFERENCE_PAIR,
        3,
        "cpu",
        phases=("prefill", "decode"),
        decode_batches=(1, 3),
        decode_steps=1,
    )
    for k in PREFILL_KEYS:  # the prefill record is the prefill-only audit's, key by key
        assert res[k] == default_audit[k], k
    dec = res["decode"]
    layers = res["layers"]
    assert dec["batches"] == [1, 3] and dec["steps"] == 1
    assert dec["cells"] == layers * 21 * 2 * 2  # 21 variants x 2 regimes x 2 batch sizes x 1 step
    assert len(dec["per_layer"]) == layers * 2 * 2
    assert all(r["m"] == r["batch"] for r in dec["per_layer"])  # never concatenated: M = the batch
    card = dec["scorecard"]
    assert card["matrix_pinned"] and card["false_positives"] == 0 and card["false_negatives"] == 0
    s = dec["per_layer_summary"]
    assert s["pow2"]["bitwise_equal"] == s["pow2"]["layers"] == layers * 2
    assert set(s["by_batch"]) == {"1", "3"}
    assert dec["end_to_end"]["pow2"]["3"]["bitwise_equal"] and dec["end_to_end"]["pow2"]["3"]["outcome"] == "silent"
    from requant.audit.report import markdown

    md = markdown(res)
    pre = res["per_layer_summary"]["pow2"]
    assert "## Decode beside prefill" in md
    assert f"| prefill | M = {res['tokens']} (packed) | {pre['bitwise_equal']}/{pre['layers']} |" in md
    assert f"| decode | M = 3, 1 steps | {layers}/{layers} |" in md


def test_decode_capture_decodes_the_greedy_tokens():
    model = load_model(DEFAULT_CHECKPOINT, engine="reference")
    toks = batch_prompts(_tokens(model, 2), 3)  # cycled: prompt 0 twice
    ops, fed, _ = decode_operands(model, toks, 3)
    want = model.greedy(toks, 3)  # independent: the runtime's own greedy loop
    assert torch.stack(fed, 1).tolist() == [w[:3] for w in want]
    q = ops[1]["model.layers.0.self_attn.q_proj"]
    assert q is ops[1]["model.layers.0.self_attn.v_proj"] and q.a.shape == (3, model.arch.hidden)
    assert torch.equal(q.a[0], q.a[2]) and torch.equal(q.s_a[0], q.s_a[2])  # same prompt, same row bits
