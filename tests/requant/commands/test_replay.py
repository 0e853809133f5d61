"""`requant replay` (requant/commands/replay.py) on records that `requant generate` made on the CPU
(embedded default, reference engine, a few new tokens): the same engine, inside a batch of 5 filler
prompts, with the other emulated epilogue order (pow2 and native), and the refusals.

References: for native scales, a direct comparison of the logits of both epilogue orders with the
recorded tokens forced (Model.generate(keep_logits=True, choose=...), torch.equal per step): the
first step where they differ is where replay must report a difference, and none means exit 0;
the embedded default's bytes changed here (a byte of model.safetensors) for the refusal.
"""

import json
import shutil

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from tests.requant.commands.cli import invoke, refused

NEW = 6
# "To bake bread, ...": under native scales the two emulated orders' logits differ on the default
# (measured); which step, and whether a token changes, the direct comparison below decides.
PROMPT = "To bake bread, mix flour, water, salt and yeast, then let the dough rise."
SAMPLED = ["--temperature", "1.0", "--seed", "1", "--top-p", "0.95"]


def make(tmp_path, name, *args, ckpt=None):
    out = tmp_path / f"{name}.jsonl"
    pre = [ckpt] if ckpt is not None else []
    res = invoke("generate", *pre, "--prompt", PROMPT, "--max-new-tokens", NEW, "--no-eos", *args, "--json", out)
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    return {
        (regime, mode): make(d, f"{regime}-{mode}", "--regime", regime, *(SAMPLED if mode == "sampled" else []))
        for regime in ("native", "pow2")
        for mode in ("greedy", "sampled")
    }


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_same_engine_and_in_a_batch_of_5_replay_exit_0(records, mode, tmp_path):
    rec = records[("native", mode)]
    res = invoke("replay", rec)
    assert res.exit_code == 0, res.output
    assert f"{NEW} tokens and their logits digests match bit for bit" in res.stdout
    out = tmp_path / "r.json"
    res = invoke("replay", rec, "--batch-with", 5, "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["ok"] and data["batch_with"] == 5 and data["records"][0]["first_difference"] is None


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_other_order_under_pow2_exits_0_in_a_batch(records, mode):
    res = invoke("replay", records[("pow2", mode)], "--backend", "reference-cutlass-order", "--batch-with", 5)
    assert res.exit_code == 0, res.output


def _first_logits_difference(rec: dict) -> int | None:
    """Direct comparison: the recorded tokens forced through both orders; the first step whose
    logits are not the same bits."""
    from requant.runtime import load_model

    a = load_model(DEFAULT_CHECKPOINT, regime=rec["regime"], backend=rec["backend"], engine="reference")
    b = a.with_backends("reference-cutlass-order")
    ids = rec["ids"]
    force = lambda step, lg: torch.tensor([ids[step]])  # noqa: E731
    la = a.generate([rec["prompt_ids"]], NEW, keep_logits=True, choose=force).step_logits
    lb = b.generate([rec["prompt_ids"]], NEW, keep_logits=True, choose=force).step_logits
    return next((i for i, (x, y) in enumerate(zip(la, lb)) if not torch.equal(x, y)), None)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_other_order_under_native_reports_the_first_difference(records, mode, tmp_path):
    out = tmp_path / "r.json"
    res = invoke("replay", records[("native", mode)], "--backend", "reference-cutlass-order", "--json", out)
    rec = json.loads(records[("native", mode)].read_text())
    step = _first_logits_difference(rec)
    data = json.loads(out.read_text())
    if step is None:  # the orders happen to agree here: all must match
        assert res.exit_code == 0 and data["ok"], res.output
        return
    assert res.exit_code == 1, res.output
    diff = data["records"][0]["first_difference"]
    assert diff["step"] == step and diff["position"] == len(rec["prompt_ids"]) + step
    assert f"first difference at step {step} (position {diff['position']})" in res.stdout
    # the token differs, or only the logits: decided by the replayed token against the recorded one
    assert diff["what"] == ("token" if diff["replayed"]["token"] != rec["ids"][step] else "logits")
    assert ("only the logits differ" in res.stdout) == (diff["what"] == "logits")
    token_step = data["records"][0]["first_token_difference"]
    assert token_step is None or token_step >= step  # no token can differ before the logits do
    assert (token_step == step) == (diff["what"] == "token")
    if mode == "greedy":  # measured on the default: the greedy token survives the difference at step 0
        assert step == 0


def test_a_changed_checkpoint_byte_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, ckpt)
    rec = make(tmp_path, "g", ckpt=ckpt)
    assert invoke("replay", rec).exit_code == 0
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # a byte of the last tensor's data
    weights.write_bytes(bytes(data))
    res = invoke("replay", rec)
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert "the checkpoint's bytes are not the record's" in line


def test_another_tokenizer_and_malformed_records_are_refused(records, tmp_path):
    rec = json.loads(records[("native", "greedy")].read_text())
    cases = {
        "tokenizer": dict(rec, tokenizer=dict(rec["tokenizer"], sha256="0" * 64)),
        "'steps'": dict(rec, ids=rec["ids"][:-1]),
        "'format'": dict(rec, format="other/9"),
        "'key'": {k: v for k, v in rec.items() if k != "key"},
        "top_p": dict(rec, sampling=dict(rec["sampling"], top_p=2.0)),
    }
    for what, bad in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        res = invoke("replay", path)
        assert res.exit_code == 2, (what, res.output)
        (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert what in line, (what, line)


def test_a_different_token_is_named_with_its_step(records, tmp_path):
    rec = json.loads(records[("pow2", "greedy")].read_text())
    true = rec["ids"][2]
    rec["ids"][2] = rec["steps"][2]["token"] = (true + 1) % 8192  # as if another token had been drawn there
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    out = tmp_path / "r.json"
    res = invoke("replay", path, "--json", out)
    assert res.exit_code == 1, res.output
    pos = len(rec["prompt_ids"]) + 2
    assert (
        f"first difference at step 2 (position {pos}): token {true} replayed, {(true + 1) % 8192} recorded"
        in res.stdout
    )
    r = json.loads(out.read_text())["records"][0]
    assert r["first_difference"]["what"] == "token" and r["first_token_difference"] == 2 and not r["match"]


def test_a_missing_file_reads_the_same_in_replay_and_generate(tmp_path):
    gone = tmp_path / "gone.jsonl"
    dangling = tmp_path / "link.jsonl"
    dangling.symlink_to(tmp_path / "nothing-here")
    for path in (gone, dangling):
        lines = [
            refused(invoke("replay", path), str(path), "no such file"),
            refused(invoke("generate", "--prompts", path), str(path), "no such file"),
        ]
        # one wording: the same text after the path, whichever command read it
        assert len({ln.split(str(path), 1)[1] for ln in lines}) == 1, lines


@pytest.mark.parametrize("k", [8193, 2**31, 2**63, 2**70])
def test_a_records_top_k_past_the_vocabulary_is_refused_not_a_mismatch(records, tmp_path, k):
    rec = json.loads(records[("native", "sampled")].read_text())
    path = tmp_path / "k.jsonl"
    path.write_text(json.dumps(dict(rec, sampling=dict(rec["sampling"], top_k=k))) + "\n")
    refused(invoke("replay", path), f"{path}:1", "'sampling.top_k'", str(k))
