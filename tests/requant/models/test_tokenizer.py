"""requant/models/tokenizer.py. References: Python's str.encode('utf-8') for byte-level ids; the
`tokenizers` library's own encode/decode of the same tokenizer.json; hashlib on the file
bytes for the digest."""

import builtins
import hashlib
import json

import pytest

from requant.models.tokenizer import TokenizerError, load_tokenizer, summary
from tests.requant.toy_tokenizer import EOT, write_byte_bpe

TEXTS = ("The quick brown fox", "thé 🙂 the\nthe", "", "def f(x):\n    return x")


def test_byte_level_without_tokenizer_json(tmp_path):
    tok = load_tokenizer(tmp_path, 512)
    assert tok.describe() == {"kind": "byte-level", "sha256": None, "vocab_size": 256, "model_vocab_size": 512}
    for t in TEXTS:
        assert tok.encode(t) == list(t.encode("utf-8"))
        assert tok.decode(tok.encode(t)) == t
    assert tok.decode([72, 105, 257, 33]) == "Hi<|257|>!"
    assert tok.eos_id is None
    assert load_tokenizer(None, 512).kind == "byte-level"
    small = load_tokenizer(None, 100)
    assert small.encode("é") == [99, 99]  # clipped to vocab - 1: lossy, and recorded as byte-level
    assert "byte-level" in summary(small.describe()) and "clipped to 99" in summary(small.describe())


def test_tokenizer_json_is_used_and_recorded(tmp_path):
    from tokenizers import Tokenizer

    path = write_byte_bpe(tmp_path)
    ref = Tokenizer.from_file(str(path))
    tok = load_tokenizer(tmp_path, 512)
    d = tok.describe()
    assert d == {
        "kind": "tokenizer.json",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "vocab_size": 259,
        "model_vocab_size": 512,
    }
    for t in TEXTS:
        assert tok.encode(t) == ref.encode(t, add_special_tokens=False).ids
        assert tok.decode(tok.encode(t)) == t
    assert tok.encode(" the")[0] == 257  # the merges apply
    assert d["sha256"] in summary(d)


def test_eos_sources_in_order(tmp_path):
    write_byte_bpe(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert load_tokenizer(tmp_path, 512).eos_id == 7
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": EOT}}))
    assert load_tokenizer(tmp_path, 512).eos_id == 258
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 258]}))
    tok = load_tokenizer(tmp_path, 512)
    assert tok.eos_id == 5 and tok.eos_ids == (5, 258)


def test_bad_tokenizers_are_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path, 512)
    write_byte_bpe(tmp_path)
    tok = load_tokenizer(tmp_path, 200)  # the model cannot embed ids >= 200
    with pytest.raises(TokenizerError, match="outside the model's vocabulary"):
        tok.encode(" the")
    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers":
            raise ImportError("no tokenizers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(TokenizerError, match="not installed"):  # no silent byte-level fallback
        load_tokenizer(tmp_path, 512)
