"""A checkpoint whose vocabulary is a real tokenizer's never falls back to byte ids silently.
References: the embedded default's own config.json (vocab_size 8192, far above the 512 ids of
the byte-level layout) and Python's str.encode('utf-8') for the byte ids an explicit opt-in gives."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from requant.models import tokenizer
from requant.models.tokenizer import TokenizerError, load_tokenizer

runner = CliRunner()


@pytest.fixture
def no_tokenizer(tmp_path):
    d = tmp_path / "default-no-tokenizer"
    shutil.copytree(DEFAULT_CHECKPOINT, d, ignore=shutil.ignore_patterns("tokenizer.json", "SHA256SUMS"))
    return d


def _one_error_line(res):
    assert "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "tokenizer.json: missing" in errors[0] and "--byte-tokens" in errors[0], res.stderr


def test_missing_tokenizer_json_is_refused_for_a_real_vocabulary(no_tokenizer):
    vocab = json.loads((no_tokenizer / "config.json").read_text())["vocab_size"]
    assert vocab > tokenizer.BYTE_LEVEL_MAX_VOCAB
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: missing.*--byte-tokens") as exc:
        load_tokenizer(no_tokenizer, vocab)
    assert str(no_tokenizer) in str(exc.value) and "\n" not in str(exc.value)


def test_byte_ids_only_when_asked_for(no_tokenizer):
    tok = load_tokenizer(no_tokenizer, 8192, byte_level=True)
    assert tok.kind == "byte-level" and tok.encode("thé") == list("thé".encode("utf-8"))
    with tokenizer.byte_ids_allowed():
        assert load_tokenizer(no_tokenizer, 8192).kind == "byte-level"
    with pytest.raises(TokenizerError):  # the permission ends with its block
        load_tokenizer(no_tokenizer, 8192)


def test_the_byte_level_vocabulary_needs_no_tokenizer_json(tmp_path):
    # 256 byte values + specials (the synthetic generator's layout): byte ids without asking
    assert load_tokenizer(tmp_path, tokenizer.BYTE_LEVEL_MAX_VOCAB).kind == "byte-level"
    assert load_tokenizer(None, 151936).kind == "byte-level"  # a model built in memory: no checkpoint to lack one


def test_determinism_refuses_a_checkpoint_that_lost_its_tokenizer(no_tokenizer):
    res = runner.invoke(
        app, ["determinism", str(no_tokenizer), "--backends", "reference", "--prompts", "1", "--new-tokens", "1"]
    )
    assert res.exit_code == 2, res.output
    _one_error_line(res)


def test_eval_refuses_a_checkpoint_that_lost_its_tokenizer(no_tokenizer, monkeypatch):
    import requant.eval.run as run

    def no_work(*args, **kwargs):
        raise AssertionError("the evaluation started")

    monkeypatch.setattr(run, "load_tasks", no_work)  # the refusal comes before the tasks, the hashing and the arms
    res = runner.invoke(app, ["eval", str(no_tokenizer), "--arms", "native", "--limit", "1"])
    assert res.exit_code == 2, res.output
    _one_error_line(res)


def test_audit_refuses_a_checkpoint_that_lost_its_tokenizer(no_tokenizer):
    res = runner.invoke(app, ["audit", str(no_tokenizer), "--backends", "reference", "--prompts", "1"])
    assert res.exit_code == 2, res.output
    _one_error_line(res)


def test_byte_tokens_option_for_one_command_only(no_tokenizer, tmp_path):
    out = tmp_path / "d.json"
    res = runner.invoke(
        app,
        [
            "determinism",
            str(no_tokenizer),
            "--backends",
            "reference",
            "--prompts",
            "1",
            "--new-tokens",
            "1",
            "--byte-tokens",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code in (0, 1), res.output  # it ran (the verdict is not the point here)
    data = json.loads(out.read_text())
    assert data["tokenizer"]["kind"] == "byte-level" and "--byte-tokens" in data["command"]
    with pytest.raises(TokenizerError):  # the permission did not outlive the command
        load_tokenizer(no_tokenizer, 8192)
