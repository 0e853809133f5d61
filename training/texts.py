"""The training corpus: which text the default model may see, cut into documents and split.

Sources (public domain, copied from ../shared/corpus into training/corpus/, sha256 pinned and
checked on every read): Jane Austen's six novels (austen.txt.gz) and the King James Bible
(kjv.txt.gz). Sense and Sensibility is the held-out evaluation novel: it is cut off at its
title line and never reaches a document, the tokenizer or the model.

Documents (the unit of the validation split and of the evaluation elsewhere):
  * Austen: each novel starts at its title line (an exact, unique line of the file, in this
    order: EMMA, MANSFIELD PARK, NORTHANGER ABBEY, Persuasion, PRIDE AND PREJUDICE,
    SENSE AND SENSIBILITY) and runs to the next title line (S&S to the end of the file).
    Inside a novel a document starts at every `CHAPTER ...` / `Chapter ...` line; the front
    matter (title, author, "VOLUME I") belongs to the first chapter's document, and a volume
    heading or an afterword to the chapter before it. 219 chapters in the five novels.
  * KJV: one document per chapter, starting at its heading line (`Genesis 1`, `Song of
    Solomon 3`, ...): 1,189 chapters of 66 books.
  1,408 documents in all: 1,380 for training (215 Austen, 1,165 KJV), 28 for validation (4, 24).
Text is kept verbatim (line wrapping, verse numbers, `_italics_`): the held-out novel comes
from the same file in the same format, so the model learns the conventions it is evaluated on.

Split: documents in corpus order (five novels in file order, then the KJV), every 50th
(index % 50 == 49) is validation (used only for early stopping), the rest is training.
The model's token stream puts `<|endoftext|>` before every document (and one at the end),
the way lm-eval's rolling log-likelihood conditions a document's first token on the
end-of-text token.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
SHA256 = {
    "austen.txt.gz": "1668bbdafc623c8e57b1ea98fc80934b3a9a3f657d82733d2f8e0d3a73427892",
    "kjv.txt.gz": "b4bdf189abb6217c91b43e907ec8dc36e06101cbd067526d9aebedecaa898825",
}
NOVELS = ("EMMA", "MANSFIELD PARK", "NORTHANGER ABBEY", "Persuasion", "PRIDE AND PREJUDICE", "SENSE AND SENSIBILITY")
HELD_OUT = "SENSE AND SENSIBILITY"
# The held-out novel's first sentence and some of its names: none may reach the training text.
HELD_OUT_PROBES = (
    "The family of Dashwood had long been settled in Sussex",
    "Dashwood",
    "Marianne",
    "Elinor",
    "Willoughby",
    "Norland",
)
CHAPTER = re.compile(r"^(CHAPTER|Chapter) \S")
KJV_HEADING = re.compile(r"^(?:[123] )?[A-Z][A-Za-z]*(?: of [A-Z][a-z]+)? \d+$")
KJV_CHAPTERS = 1189
VAL_EVERY = 50
EOT = "<|endoftext|>"


class CorpusError(ValueError):
    """The corpus is not the pinned one, or its structure is not what the splitter expects."""


@dataclass(frozen=True)
class Document:
    source: str  # "austen" or "kjv"
    book: str  # novel title line, or KJV book name
    heading: str  # the document's first line
    text: str


def read_text(name: str, corpus_dir: Path = CORPUS_DIR) -> str:
    """A corpus file's text, after checking its sha256 against the pinned one."""
    path = Path(corpus_dir) / name
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read the corpus file ({exc.strerror or exc})") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHA256[name]:
        raise CorpusError(f"{path}: sha256 {digest} is not the pinned {SHA256[name]}")
    return gzip.decompress(raw).decode("utf-8")


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    if starts[-1] == len(text):
        starts.pop()
    return starts


def _cut(text: str, starts: list[int]) -> list[str]:
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def split_novels(austen: str) -> dict[str, str]:
    """{title line: the novel's text from its title line to the next title line}."""
    lines = austen.split("\n")
    offsets = _line_starts(austen)
    where = {}
    for title in NOVELS:
        hits = [i for i, line in enumerate(lines) if line == title]
        if len(hits) != 1:
            raise CorpusError(f"austen.txt.gz: title line {title!r} found {len(hits)} times, expected once")
        where[title] = hits[0]
    order = [where[t] for t in NOVELS]
    if order != sorted(order) or order[0] != 0:
        raise CorpusError(f"austen.txt.gz: title lines not in the expected order {NOVELS}")
    pieces = _cut(austen, [offsets[i] for i in order])
    return dict(zip(NOVELS, pieces))


def novel_documents(title: str, text: str) -> list[Document]:
    """One document per chapter; the front matter joins the first chapter."""
    offsets = _line_starts(text)
    heads = [i for i, line in enumerate(text.split("\n")) if CHAPTER.match(line)]
    if not heads:
        raise CorpusError(f"austen.txt.gz: novel {title!r} has no chapter lines")
    starts = [0] + [offsets[i] for i in heads[1:]]
    headings = [text[offsets[i] :].split("\n", 1)[0] for i in heads]
    return [Document("austen", title, h, t) for h, t in zip(headings, _cut(text, starts))]


def kjv_documents(kjv: str) -> list[Document]:
    """One document per chapter, from its heading line to the next (the blank preamble before
    `Genesis 1` is dropped)."""
    offsets = _line_starts(kjv)
    heads = [i for i, line in enumerate(kjv.split("\n")) if KJV_HEADING.match(line)]
    if len(heads) != KJV_CHAPTERS:
        raise CorpusError(f"kjv.txt.gz: found {len(heads)} chapter headings, expected {KJV_CHAPTERS}")
    if kjv[: offsets[heads[0]]].strip():
        raise CorpusError("kjv.txt.gz: text before the first chapter heading")
    pieces = _cut(kjv, [offsets[i] for i in heads])
    docs = []
    for piece in pieces:
        heading = piece.split("\n", 1)[0]
        docs.append(Document("kjv", heading.rsplit(" ", 1)[0], heading, piece))
    return docs


def training_documents(corpus_dir: Path = CORPUS_DIR) -> list[Document]:
    """Every document the model may see (training and validation), in corpus order; the
    held-out novel is excluded here, and checked absent."""
    novels = split_novels(read_text("austen.txt.gz", corpus_dir))
    docs: list[Document] = []
    for title, text in novels.items():
        if title != HELD_OUT:
            docs.extend(novel_documents(title, text))
    docs.extend(kjv_documents(read_text("kjv.txt.gz", corpus_dir)))
    assert_no_held_out(docs)
    return docs


def assert_no_held_out(docs: list[Document]) -> None:
    """Raise CorpusError if any probe string of the held-out novel is in a document."""
    for d in docs:
        if d.book == HELD_OUT:
            raise CorpusError(f"held-out novel document {d.heading!r} in the training set")
        for probe in HELD_OUT_PROBES:
            if probe in d.text:
                raise CorpusError(f"held-out text {probe!r} found in training document {d.book} / {d.heading}")


def split(docs: list[Document]) -> tuple[list[Document], list[Document]]:
    """(training, validation): every VAL_EVERY-th document (index % 50 == 49) validates."""
    train = [d for i, d in enumerate(docs) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [d for i, d in enumerate(docs) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val
