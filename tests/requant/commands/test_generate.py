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
from tests.requant.commands.cli import invoke, refused

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
        ([], "no prompt: give --prompt"),
        (["--prompt", "a", "--prompts", "x.jsonl"], "not both"),
        (["--prompt", "a", "--temperature", "-1"], "--temperature"),
        (["--prompt", "a", "--top-p", "0"], "--top-p"),
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


def test_generate_without_prompt_says_give_one():
    line = refused(invoke("generate"), "no prompt", "--prompt", "--prompts")
    assert "not both" not in line


# Each sampling option alone out of its range, with values drawn around each bound (and the
# degenerate ones: NaN, infinities, the integer bounds' next values): the line names that option
# and its range, and no other sampling option.
_BAD = {
    "--temperature": ["-1", "-1e-300", "nan", "inf", "-inf"],
    "--top-k": ["-1", str(2**31), str(2**63), str(2**70), str(10**30)],
    "--top-p": ["0", "1.5", "-0.1", "1.0000001", "nan", "inf"],
    "--seed": ["-1", str(2**64), str(2**70)],
}
_RANGE = {
    "--temperature": ">= 0",
    "--top-k": "from 0 (every token) to the vocabulary's size",
    "--top-p": "(0, 1]",
    "--seed": "[0, 2**64)",
}


@pytest.mark.parametrize("option,value", [(o, v) for o, vs in _BAD.items() for v in vs])
def test_top_p_out_of_range_names_only_that_option(option, value):
    line = refused(invoke("generate", "--prompt", "a", option, value), option, _RANGE[option])
    others = [o for o in _BAD if o != option]
    assert not any(o in line for o in others), line


@pytest.mark.parametrize("k", [8193, 2**31, 2**63, 2**70, 10**30])
def test_top_k_past_the_vocabulary_is_refused_naming_the_option_or_the_line(k, tmp_path):
    vocab = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())["vocab_size"]
    assert vocab == 8192  # the values above straddle it
    refused(invoke("generate", "--prompt", "a", "--top-k", k), "--top-k", str(k))
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "a"}\n' + json.dumps({"prompt": "b", "top_k": k}) + "\n")
    refused(invoke("generate", "--prompts", pf), f"{pf}:2", "top_k", str(k))


def test_top_k_as_a_float_in_a_prompts_file_is_refused(tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "b", "top_k": 1e30}\n')
    refused(invoke("generate", "--prompts", pf), f"{pf}:1", "top_k")


def test_the_vocabulary_size_itself_is_a_top_k(tmp_path):
    out = tmp_path / "g.jsonl"
    res = invoke(
        "generate", "--prompt", "a", "--top-k", 8192, "--temperature", "1", "--max-new-tokens", 2, "--json", out
    )
    assert res.exit_code == 0, res.output
    assert records(out)[0]["sampling"]["top_k"] == 8192


# Sampled prompts, each with its own seed: at temperature 1.5 several of these stop at eos within
# 12 tokens on the embedded default (measured: seeds 87, 98, 108), the rest run to the length.
EOS_SEEDS = range(80, 112)


def test_a_sampled_prompt_that_stops_at_eos_prints_and_records_no_eos_text(tmp_path, model):
    tok = model.tokenizer
    eos_text = tok.decode(list(tok.eos_ids))
    assert eos_text == "<|endoftext|>"
    pf = tmp_path / "p.jsonl"
    pf.write_text("".join(json.dumps({"prompt": "Hello", "seed": s}) + "\n" for s in EOS_SEEDS))
    out = tmp_path / "g.jsonl"
    res = invoke("generate", "--prompts", pf, "--temperature", "1.5", "--max-new-tokens", 12, "--json", out)
    assert res.exit_code == 0, res.output
    recs = records(out)
    stopped = [r for r in recs if r["stop"] == "eos"]
    assert stopped and len(stopped) < len(recs)
    for r in recs:
        body = r["ids"][:-1] if r["stop"] == "eos" else r["ids"]
        assert r["ids"][-1] in tok.eos_ids if r["stop"] == "eos" else r["ids"][-1] not in tok.eos_ids
        assert r["text"] == tok.decode(body) and eos_text not in r["text"]
        assert [s["token"] for s in r["steps"]] == r["ids"]  # the tokens stay as generated
    assert eos_text not in res.stdout
    for r in stopped:
        assert "Hello" + r["text"] + "\n" in res.stdout
    # one prompt alone streams token by token: the same text, no eos text either
    seed = stopped[0]["sampling"]["seed"]
    one = tmp_path / "one.jsonl"
    res = invoke("generate", "--prompt", "Hello", "--seed", seed, "--temperature", "1.5", "--max-new-tokens", 12,
                 "--json", one)  # fmt: skip
    assert res.exit_code == 0, res.output
    (rec,) = records(one)
    assert rec["stop"] == "eos" and res.stdout == "Hello" + stopped[0]["text"] + "\n"
    for path in (out, one):  # the records replay bit for bit
        rep = invoke("replay", path)
        assert rep.exit_code == 0, rep.output
