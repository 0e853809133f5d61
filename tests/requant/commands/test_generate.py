"""`requant generate` (requant/commands/generate.py, requant/runtime/generation.py) through the CLI app on the
CPU: the embedded default, the reference engine, a few new tokens.

References: Model.greedy (the runtime's own argmax loop) for greedy ids; hashlib over the fp32
bytes of logits that Model.generate(keep_logits=True) returns when forced to the recorded tokens,
for the digests; torch.log_softmax in float64 for the logprobs (close, not the definition: the
definition is tested bit for bit in test_sampling.py); the tokenizer for the printed text;
requant.evidence.identity for the identity keys.
"""

import hashlib
import json

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from tests.requant.commands.cli import invoke

NEW = 5


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def model():
    from requant.runtime import load_model

    return load_model(DEFAULT_CHECKPOINT, engine="reference", backend="reference-triton-order")


def test_greedy_record_holds_the_runtimes_tokens_digests_and_identity(tmp_path, model):
    out = tmp_path / "g.jsonl"
    res = invoke("generate", "--prompt", "The quick brown fox", "--max-new-tokens", NEW, "--no-eos", "--json", out)
    assert res.exit_code == 0, res.output
    (rec,) = records(out)
    tok = model.tokenizer
    prompt = tok.encode("The quick brown fox")
    want = model.greedy([prompt], NEW)[0]
    assert rec["prompt_ids"] == prompt and rec["ids"] == want and rec["stop"] == "length"
    assert res.stdout == tok.decode(prompt) + tok.decode(want) + "\n"  # streamed, then the newline
    forced = model.generate([prompt], NEW, keep_logits=True, choose=lambda step, lg: torch.tensor([want[step]]))
    for i, (s, lg) in enumerate(zip(rec["steps"], forced.step_logits)):
        assert s["position"] == len(prompt) + i and s["token"] == want[i]
        assert s["logits_sha256"] == hashlib.sha256(lg[0].numpy().tobytes()).hexdigest()
        exact = torch.log_softmax(lg[0].double(), 0)[want[i]].item()
        assert abs(float.fromhex(s["logprob"]) - exact) <= 1e-12 * max(1.0, abs(exact))
    from requant.checkpoint import open_checkpoint
    from requant.evidence.identity import checkpoint_identity

    ident = checkpoint_identity(open_checkpoint(DEFAULT_CHECKPOINT))
    assert rec["manifest_digest"] == ident["manifest_digest"] and rec["tool_version"] == ident["tool_version"]
    assert rec["checkpoint"] is None and rec["tokenizer"] == tok.describe()
    assert rec["engine"] == "reference" and rec["backend"] == "reference-triton-order"
    assert rec["epilogue_order"] == kernels.EMULATION_OF["reference-triton-order"] and rec["regime"] == "native"
    assert rec["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "method": "greedy"}
    assert rec["eos_ids"] == [] and rec["max_new_tokens"] == NEW and "git_commit" in rec
    assert "--prompt 'The quick brown fox'" in rec["command"] and "--no-eos" in rec["command"]


def test_prompts_file_with_per_request_sampling(tmp_path, model):
    from requant.runtime.sampling import SamplingParams, generate

    pf = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "It is a truth"},
        {"prompt_ids": [5, 6, 7], "temperature": 0.0},
        {"prompt": "Rivers carry", "seed": 9, "key": "mine", "top_k": 3},
    ]
    pf.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "g.jsonl"
    res = invoke("generate", "--prompts", pf, "--temperature", "0.8", "--top-p", "0.9", "--seed", "4",
                 "--max-new-tokens", NEW, "--regime", "pow2", "--json", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    recs = records(out)
    assert [r["sampling"]["temperature"] for r in recs] == [0.8, 0.0, 0.8]
    assert [r["sampling"]["seed"] for r in recs] == [4, 4, 9] and recs[2]["sampling"]["top_k"] == 3
    assert recs[2]["key"] == "mine" and recs[0]["regime"] == "pow2" and recs[1]["prompt"] is None
    # the same requests through the Python API, each alone (the command ran them as one batch)
    from requant.runtime import load_model

    pow2 = load_model(DEFAULT_CHECKPOINT, regime="pow2", engine="reference", share=model)
    tok = model.tokenizer
    eos = list(tok.eos_ids)
    for r, x in zip(recs, lines):
        ids = tok.encode(x["prompt"]) if "prompt" in x else x["prompt_ids"]
        p = SamplingParams(
            r["sampling"]["temperature"], r["sampling"]["top_k"], 0.9, r["sampling"]["seed"], x.get("key")
        )
        (alone,) = generate(pow2, [ids], [p], NEW, eos_id=eos)
        assert alone.ids == r["ids"] and [s.logits_sha256 for s in alone.steps] == [
            s["logits_sha256"] for s in r["steps"]
        ]
        assert r["text"] == tok.decode(r["ids"]) and r["text"] in res.stdout


@pytest.mark.parametrize(
    "args,what",
    [
        ([], "give --prompt"),
        (["--prompt", "a", "--prompts", "x.jsonl"], "not both"),
        (["--prompt", "a", "--temperature", "-1"], "temperature"),
        (["--prompt", "a", "--top-p", "0"], "top_p"),
        (["--prompt", "a", "--regime", "nearest"], "--regime"),
        (["--prompt", "a", "--backend", "nope"], "--backend"),
        (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, what):
    res = invoke("generate", *args)
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert what in line


def test_a_bad_prompts_line_is_named(tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "ok"}\n{"prompt": "x", "tempreature": 1}\n')
    res = invoke("generate", "--prompts", pf)
    assert res.exit_code == 2 and f"{pf}:2" in res.stderr and "tempreature" in res.stderr
