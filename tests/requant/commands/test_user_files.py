"""Values in the files a user hands to requant (`generate --prompts`, `replay RECORD`): each bad value
is one `error:` line naming the file and line, exit 2, never a traceback, a hang or a crash.

Real CLI runs (requant.cli app, CliRunner) on the embedded default (vocabulary 0..8191, 2,048
positions). The record the refusals start from is one `requant generate --json` wrote here; each
case changes one field of it. References: the text written into a file (U+2028 / U+0085 stay
inside one prompt), a run with top_k 0 (a top_k past the vocabulary keeps every token too).
"""

import json
import os

import pytest

from requant.io.jsonlines import MAX_FILE_BYTES, MAX_LINE_BYTES
from tests.requant.commands.cli import invoke, refused


def prompts(tmp_path, *lines, name="p.jsonl") -> str:
    p = tmp_path / name
    p.write_bytes(b"".join(ln if isinstance(ln, bytes) else ln.encode() + b"\n" for ln in lines))
    return str(p)


def gen(*args):
    return invoke("generate", *args, "--max-new-tokens", 2)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "r.jsonl"
    res = invoke("generate", "--prompt", "It is a truth", "--max-new-tokens", 3, "--no-eos", "--json", out)
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def replay_of(tmp_path, rec, raw=None):
    p = tmp_path / "bad.jsonl"
    p.write_text(raw if raw is not None else json.dumps(rec) + "\n")
    return invoke("replay", p), str(p)


# -- --prompts ----------------------------------------------------------------------------------
def test_prompts_negative_id(tmp_path):
    f = prompts(tmp_path, '{"prompt_ids": [5, -1]}')
    refused(gen("--prompts", f), f"--prompts {f}:1", "-1")


def test_prompts_id_past_2_63(tmp_path):
    f = prompts(tmp_path, '{"prompt": "ok"}', f'{{"prompt_ids": [{2**63}]}}')
    refused(gen("--prompts", f), f"--prompts {f}:2", str(2**63), "0..8191")


def test_prompts_id_past_the_vocabulary_names_file_and_line(tmp_path):
    f = prompts(tmp_path, "", '{"prompt_ids": [1, 8192]}')
    refused(gen("--prompts", f), f"--prompts {f}:2", "8192", "0..8191")


def test_prompts_lone_surrogate_text(tmp_path):
    f = prompts(tmp_path, '{"prompt": "a\\ud800b"}')
    refused(gen("--prompts", f), f"{f}:1", "lone surrogate")


def test_prompts_lone_surrogate_key_is_never_written_to_a_record(tmp_path):
    f = prompts(tmp_path, '{"prompt": "hi", "key": "\\ud800"}')
    out = tmp_path / "r.jsonl"
    refused(gen("--prompts", f, "--json", out), f"{f}:1", "lone surrogate")
    assert not out.exists()


def test_prompt_argument_with_bytes_that_are_not_utf8(tmp_path):
    refused(gen("--prompt", "a\udcffb"), "--prompt 0", "UTF-8")  # how Python hands over a byte 0xff


def test_prompts_100000_deep_json(tmp_path):
    f = prompts(tmp_path, "[" * 100_000 + "]" * 100_000)
    refused(gen("--prompts", f), f"{f}:1", "nested")


def test_prompts_nan_is_not_json(tmp_path):
    f = prompts(tmp_path, '{"prompt": "hi", "temperature": NaN}')
    refused(gen("--prompts", f), f"{f}:1", "NaN")


def test_prompts_dev_zero(tmp_path):
    refused(gen("--prompts", "/dev/zero"), "--prompts /dev/zero", "device")


def test_prompts_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "p.fifo"
    os.mkfifo(fifo)  # nothing ever writes it: opening it blocking would hang
    refused(gen("--prompts", fifo), "FIFO")


def test_prompts_file_past_the_size_cap(tmp_path):
    p = tmp_path / "big.jsonl"
    with open(p, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse, costs no disk
    refused(gen("--prompts", p), f"--prompts {p}:", f"more than the {MAX_FILE_BYTES:,}")


def test_prompts_100_mb_line(tmp_path):
    p = tmp_path / "big.jsonl"
    with open(p, "wb") as f:
        f.truncate(100 << 20)  # one line of 100 MB; sparse, costs no disk
    refused(gen("--prompts", p), f"--prompts {p}:1", f"more than the {MAX_LINE_BYTES:,}")


def test_prompts_line_past_the_line_cap(tmp_path):
    f = prompts(tmp_path, '{"prompt": "ok"}', '{"prompt": "' + "a" * (17 << 20) + '"}')
    refused(gen("--prompts", f), f"{f}:2", "bytes, more than")


def test_prompts_u2028_and_u0085_stay_inside_one_prompt(tmp_path):
    text = "one\u2028two\u0085three"
    f = prompts(tmp_path, json.dumps({"prompt": text}, ensure_ascii=False))
    out = tmp_path / "r.jsonl"
    res = gen("--prompts", f, "--json", out)
    assert res.exit_code == 0, res.output
    (rec,) = [json.loads(ln) for ln in out.read_text(encoding="utf-8").split("\n") if ln]
    assert rec["prompt"] == text  # the reference: what was written, one prompt
    res = invoke("replay", out)  # and its record reads back as one record
    assert res.exit_code == 0, res.output


def test_prompts_top_k_of_the_vocabulary_size_keeps_every_token(tmp_path):
    # past the vocabulary (2**63 included) is refused: test_generate.py
    outs = []
    for k in (8192, 0):
        f = prompts(
            tmp_path, json.dumps({"prompt": "hi", "temperature": 1.0, "top_k": k, "seed": 3}), name=f"{k}.jsonl"
        )
        out = tmp_path / f"{k}.r.jsonl"
        res = gen("--prompts", f, "--json", out)
        assert res.exit_code == 0, res.output
        outs.append(json.loads(out.read_text())["steps"])
    assert outs[0] == outs[1]


# -- records ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [{"a": 1}, [1]], ids=["dict", "list"])
def test_record_checkpoint_not_a_string(tmp_path, record, value):
    res, p = replay_of(tmp_path, dict(record, checkpoint=value))
    refused(res, f"{p}:1", "'checkpoint'")


@pytest.mark.parametrize("value", [5, None], ids=["int", "null"])
def test_record_step_digest_not_a_digest(tmp_path, record, value):
    steps = [dict(record["steps"][0], logits_sha256=value)] + record["steps"][1:]
    res, p = replay_of(tmp_path, dict(record, steps=steps))
    refused(res, f"{p}:1", "steps[0].logits_sha256")


def test_record_key_lone_surrogate(tmp_path, record):
    raw = json.dumps(record).replace('"key": "', '"key": "\\ud800', 1) + "\n"
    res, p = replay_of(tmp_path, None, raw=raw)
    refused(res, f"{p}:1", "lone surrogate")


def test_record_max_new_tokens_negative_names_file_and_line(tmp_path, record):
    res, p = replay_of(tmp_path, None, raw="\n" + json.dumps(dict(record, max_new_tokens=-1)) + "\n")
    refused(res, f"{p}:2", "'max_new_tokens'")


def test_record_id_past_2_63(tmp_path, record):
    ids = [2**63] + record["prompt_ids"][1:]
    res, p = replay_of(tmp_path, dict(record, prompt_ids=ids))
    refused(res, f"{p}:1", "'prompt_ids'", str(2**63))


def test_record_id_past_the_vocabulary(tmp_path, record):
    ids = [8192] + record["prompt_ids"][1:]
    res, p = replay_of(tmp_path, dict(record, prompt_ids=ids))
    refused(res, f"{p}:1", "'prompt_ids'", "0..8191")


def test_record_past_the_models_positions(tmp_path, record):
    res, p = replay_of(tmp_path, dict(record, max_new_tokens=3000))
    refused(res, f"{p}:1", "2048")


def test_record_fifo_and_device(tmp_path):
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    refused(invoke("replay", fifo), "FIFO")
    refused(invoke("replay", "/dev/zero"), "device")


@pytest.mark.parametrize(
    "field, value",
    [("engine", "bogus"), ("backend", "nope"), ("act_backend", "x"), ("reduction", "x"), ("regime", "x")],
)
def test_record_unknown_names_say_file_line_and_field(tmp_path, record, field, value):
    res, p = replay_of(tmp_path, dict(record, **{field: value}))
    refused(res, f"{p}:1", f"'{field}'", value)


@pytest.mark.parametrize("field", ["revision", "checkpoint_path"])
def test_record_optional_strings_of_another_type(tmp_path, record, field):
    res, p = replay_of(tmp_path, dict(record, **{field: 5}))
    refused(res, f"{p}:1", f"'{field}'")
