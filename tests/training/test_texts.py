"""training/texts.py: the held-out novel never reaches the training text, the documents are the
corpus cut (nothing lost, nothing reordered), and the validation split is disjoint from the
training split. Independent references: the decompressed corpus files searched as plain
strings (gzip + str.find), and hashlib for the pinned digests."""

from __future__ import annotations

import gzip
import hashlib
import shutil

import pytest

from training import texts


@pytest.fixture(scope="module")
def raw():
    return {n: gzip.decompress((texts.CORPUS_DIR / n).read_bytes()).decode("utf-8") for n in texts.SHA256}


@pytest.fixture(scope="module")
def docs():
    return texts.training_documents()


def test_pinned_digests_are_the_files():
    for name, digest in texts.SHA256.items():
        assert hashlib.sha256((texts.CORPUS_DIR / name).read_bytes()).hexdigest() == digest


def test_held_out_novel_is_absent(raw, docs):
    austen = raw["austen.txt.gz"]
    start = austen.find("\nSENSE AND SENSIBILITY\n") + 1
    assert start > 0 and austen.find("\nSENSE AND SENSIBILITY\n", start) == -1
    held_out = austen[start:]
    opening = "The family of Dashwood had long been settled in Sussex"
    assert opening in held_out  # the probe is really the held-out novel's text
    assert all(opening not in d.text for d in docs)
    # every long line of the held-out novel, not just its opening, is absent
    lines = {ln for ln in held_out.split("\n") if len(ln) > 60}
    assert len(lines) > 5000
    training_lines = {ln for d in docs for ln in d.text.split("\n")}
    assert sorted(lines & training_lines) == []
    assert {d.book for d in docs if d.source == "austen"} == {
        "EMMA",
        "MANSFIELD PARK",
        "NORTHANGER ABBEY",
        "Persuasion",
        "PRIDE AND PREJUDICE",
    }


def test_documents_are_the_corpus_cut(raw, docs):
    """Austen: the training documents joined are the file up to the held-out title line;
    KJV: the file from `Genesis 1` on. Chapters start their documents."""
    austen, kjv = raw["austen.txt.gz"], raw["kjv.txt.gz"]
    cut = austen.find("\nSENSE AND SENSIBILITY\n") + 1
    assert "".join(d.text for d in docs if d.source == "austen") == austen[:cut]
    genesis = kjv.find("Genesis 1\n")
    assert kjv[:genesis].strip() == ""
    assert "".join(d.text for d in docs if d.source == "kjv") == kjv[genesis:]
    austen_docs = [d for d in docs if d.source == "austen"]
    kjv_docs = [d for d in docs if d.source == "kjv"]
    assert len(austen_docs) == 55 + 48 + 31 + 24 + 61 and len(kjv_docs) == 1189
    assert len({d.book for d in kjv_docs}) == 66
    firsts = {d.book: d for d in reversed(austen_docs)}  # each novel's first document
    for d in docs:
        if d is firsts.get(d.book):  # front matter (title line, author, volume) then chapter 1
            assert d.text.startswith(d.book + "\n") and f"\n{d.heading}\n" in d.text
        else:
            assert d.text.startswith(d.heading + "\n")
    assert {b: d.heading for b, d in firsts.items()} == {
        "EMMA": "CHAPTER I",
        "MANSFIELD PARK": "CHAPTER I",
        "NORTHANGER ABBEY": "CHAPTER 1",
        "Persuasion": "Chapter 1",
        "PRIDE AND PREJUDICE": "Chapter 1",
    }
    assert kjv_docs[-1].heading == "Revelation 22"


def test_validation_split_is_disjoint(docs):
    train, val = texts.split(docs)
    assert len(train) + len(val) == len(docs) and len(val) == len(docs) // 50
    assert val == [docs[i] for i in range(49, len(docs), 50)]
    train_texts = {d.text for d in train}
    assert all(d.text not in train_texts for d in val)
    assert {d.source for d in val} == {"austen", "kjv"}
    assert all(d.book != texts.HELD_OUT for d in val)


def test_tampered_corpus_is_refused(tmp_path):
    for name in texts.SHA256:
        shutil.copyfile(texts.CORPUS_DIR / name, tmp_path / name)
    data = bytearray((tmp_path / "kjv.txt.gz").read_bytes())
    data[-9] ^= 1  # inside the gzip trailer's CRC: still a file, not the pinned one
    (tmp_path / "kjv.txt.gz").write_bytes(bytes(data))
    with pytest.raises(texts.CorpusError, match="kjv.txt.gz: sha256 .* is not the pinned"):
        texts.training_documents(tmp_path)
    with pytest.raises(texts.CorpusError, match="cannot read"):
        texts.read_text("austen.txt.gz", tmp_path / "nowhere")


def test_held_out_text_in_a_document_is_caught():
    leak = texts.Document(
        "austen", "EMMA", "CHAPTER I", "CHAPTER I\nThe family of Dashwood had long been settled in Sussex.\n"
    )
    with pytest.raises(texts.CorpusError, match="held-out text"):
        texts.assert_no_held_out([leak])
