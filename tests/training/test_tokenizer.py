"""The committed tokenizer: pinned, reproduced by retraining (about 4 s on 2 cores), exact on
round trips, and loadable by transformers. Independent references: the sha256 literal below
(the committed file's digest, pinned twice: here and in train_tokenizer.py), the original
strings for round trips, the corpus files, and transformers' own AutoTokenizer /
GenerationConfig loaders."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from training import texts, tokens, train_tokenizer
from training.train_tokenizer import TOKENIZER_DIR

COMMITTED_SHA256 = "9f3a074379204c1fcd20099deb04428cf5fbe03c1ad25030f66a758ff32f58e3"
ODD = [
    "",
    " ",
    "\n\n\n",
    "  1 In the beginning",
    "\r\n\tTabs\tand CRLF\r\n",
    "£5, 'tis—“quoted”…",
    "e\u0301 vs \u00e9 (NFD and NFC kept apart)",
    "日本語のテキスト",
    "emoji 🙂👍🏽",
    "\x00\x01 control",
    "<|endoftext|> typed as text",
    "_italic_ -- dashes --",
    "x" * 3000,
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))


def test_committed_tokenizer_is_pinned():
    assert hashlib.sha256((TOKENIZER_DIR / "tokenizer.json").read_bytes()).hexdigest() == COMMITTED_SHA256
    assert train_tokenizer.TOKENIZER_SHA256 == COMMITTED_SHA256


def test_retraining_reproduces_the_committed_files(tmp_path):
    assert train_tokenizer.main(["--out", str(tmp_path), "--check"]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / name).read_bytes() == (TOKENIZER_DIR / name).read_bytes(), name


def test_vocabulary_layout(tok):
    vocab = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    assert tok.get_vocab_size() == len(vocab) == 8192
    assert tok.token_to_id("<|endoftext|>") == 0
    by_id = {i: t for t, i in vocab.items()}
    assert {by_id[i] for i in range(1, 257)} == set(pre_tokenizers.ByteLevel.alphabet())
    # the special token is one id when encoded as a special token, never split
    assert tok.encode("a<|endoftext|>b").ids[1] == 0


def test_round_trip_on_corpus_and_odd_strings(tok):
    austen = texts.read_text("austen.txt.gz")
    kjv = texts.read_text("kjv.txt.gz")
    samples = [austen[i : i + 20000] for i in range(0, len(austen), len(austen) // 7)]
    samples += [kjv[i : i + 20000] for i in range(0, len(kjv), len(kjv) // 7)]
    samples += ODD
    for x in samples:
        ids = tok.encode(x, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == x
    # the whole held-out novel round-trips too (it is never trained on, only encoded)
    ss = texts.split_novels(austen)[texts.HELD_OUT]
    assert tok.decode(tok.encode(ss).ids) == ss


def test_transformers_loads_it():
    transformers = pytest.importorskip("transformers")
    at = transformers.AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    assert (at.eos_token, at.pad_token, at.bos_token) == ("<|endoftext|>",) * 3
    assert (at.eos_token_id, at.pad_token_id, at.bos_token_id) == (0, 0, 0)
    assert at.model_max_length == 2048
    for x in [o for o in ODD[1:] if "<|endoftext|>" not in o] + [
        "It is a truth universally acknowledged, that a single man"
    ]:
        ids = at(x)["input_ids"]
        assert ids[0] != 0 and at.decode(ids) == x  # no bos added, exact decode (no space clean-up)
    assert at("a<|endoftext|>b")["input_ids"][1] == 0
    gc = transformers.GenerationConfig.from_pretrained(str(TOKENIZER_DIR))
    assert (gc.eos_token_id, gc.pad_token_id, gc.bos_token_id) == (0, 0, 0)


def test_token_streams_are_the_pinned_data(tok):
    """The streams the GPU run will train on: pinned digests, one separator per document
    (plus the last), and each document's ids equal to encoding its text alone."""
    streams = tokens.token_streams()
    assert {k: tokens.stream_digest(v) for k, v in streams.items()} == tokens.STREAM_SHA256
    train_docs, val_docs = texts.split(texts.training_documents())
    for name, docs in (("train", train_docs), ("val", val_docs)):
        s = streams[name]
        assert s.dtype == np.uint16 and s[0] == 0 and s[-1] == 0
        assert int((s == 0).sum()) == len(docs) + 1
    val = streams["val"]
    cuts = np.flatnonzero(val == 0)
    for i in (0, 5, len(val_docs) - 1):
        assert val[cuts[i] + 1 : cuts[i + 1]].tolist() == tok.encode(val_docs[i].text).ids
