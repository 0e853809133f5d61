"""The shipped held-out set (requant/data/heldout) and the script that makes it.

Independent references: the pinned sha256 of the shipped file; the novel's own first and
last sentences; a word count of the corpus taken with plain str.split from the title line
to the end, minus the words that are not prose (title block, 50 chapter headings, THE END);
and regeneration from the corpus itself, byte for byte, where the corpus is present.
"""

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from requant.eval import heldout
from requant.eval.task import HELDOUT_FILE, heldout_docs


def _corpus() -> Path | None:
    for p in (os.environ.get("REQUANT_CORPUS"), heldout.default_corpus()):
        if p and Path(p).is_file():
            return Path(p)
    return None


def test_shipped_file_is_the_pinned_one():
    data = HELDOUT_FILE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == heldout.OUTPUT_SHA256
    assert HELDOUT_FILE == heldout.DEFAULT_OUTPUT
    docs = heldout_docs()
    assert len(docs) == 50
    assert [d["title"] for d in docs] == [f"Sense and Sensibility, Chapter {n}" for n in range(1, 51)]
    assert all(set(d) == {"title", "text"} for d in docs)
    assert docs[0]["text"].startswith("The family of Dashwood had long been settled in Sussex.")
    assert docs[-1]["text"].endswith("or producing coolness between their husbands.")
    for d in docs:
        assert d["text"] == d["text"].strip() and "CHAPTER" not in d["text"] and "THE END" not in d["text"]
    assert [json.loads(line) for line in data.decode("ascii").splitlines()] == docs


def test_regenerates_byte_for_byte_from_the_corpus(tmp_path):
    corpus = _corpus()
    if corpus is None:
        pytest.skip("the shared Austen corpus is not on this machine (set REQUANT_CORPUS)")
    out = tmp_path / "s.jsonl"
    assert heldout.make(corpus, out) == heldout.OUTPUT_SHA256
    assert out.read_bytes() == HELDOUT_FILE.read_bytes()
    lines = gzip.decompress(corpus.read_bytes()).decode("utf-8").split("\n")
    novel_words = sum(len(line.split()) for line in lines[heldout.TITLE_LINENO - 1 :])
    not_prose = len("SENSE AND SENSIBILITY by Jane Austen (1811)".split()) + 2 * 50 + len("THE END".split())
    assert sum(len(d["text"].split()) for d in heldout_docs()) == novel_words - not_prose


def test_refuses_a_corpus_it_does_not_recognise(tmp_path):
    bad = tmp_path / "c.txt.gz"
    bad.write_bytes(gzip.compress(b"SENSE AND SENSIBILITY\n\nCHAPTER 1\n\ntext\n\nCHAPTER 3\n\nmore\n"))
    with pytest.raises(ValueError, match="sha256"):
        heldout.make(bad, tmp_path / "o.jsonl")
    with pytest.raises(ValueError, match="CHAPTER 1..50"):
        heldout.make(bad, tmp_path / "o.jsonl", check_source=False)
    with pytest.raises(ValueError, match="one line"):
        heldout.chapters(["no title here"])
    assert not (tmp_path / "o.jsonl").exists()
    assert heldout.main([str(bad), "-o", str(tmp_path / "o.jsonl")]) == 2
