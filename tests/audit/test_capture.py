"""audit/capture.py: prompts and tokenization (reference: Python's str.encode('utf-8'))."""

import builtins

import pytest

from requant.audit.capture import CALIBRATION_PROMPTS, prompts, tokenizer_for


def test_byte_level_is_utf8_clipped_to_vocab():
    enc, kind = tokenizer_for(None, 512)
    assert kind == "byte-level"
    for p in CALIBRATION_PROMPTS:
        assert enc(p) == list(p.encode("utf-8"))
    small, _ = tokenizer_for(None, 100)
    assert small("é") == [99, 99]


def test_tokenizer_json_without_the_library_falls_back(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers":
            raise ImportError("no tokenizers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    enc, kind = tokenizer_for(tmp_path, 512)
    assert kind == "byte-level" and enc("A") == [65]


def test_prompts_are_a_prefix_of_the_fixed_set():
    assert prompts(3) == list(CALIBRATION_PROMPTS[:3])
    assert len(set(CALIBRATION_PROMPTS)) == len(CALIBRATION_PROMPTS) == 16


def test_tokenizer_json_is_used_when_the_library_is_present(tmp_path):
    # Reference: the `tokenizers` library's own encode() of a tokenizer.json written here
    # (a word-level vocabulary, so the expected ids are known in advance).
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "mat": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    encode, kind = tokenizer_for(tmp_path, vocab=512)
    assert kind == "tokenizer.json"
    assert encode("the cat sat on the mat") == [1, 2, 3, 0, 1, 4]
    assert encode("the cat sat on the mat") == tok.encode("the cat sat on the mat").ids
