"""Make the held-out evaluation set: Sense and Sensibility, one document per chapter.

    python -m requant.eval.heldout [CORPUS] [-o requant/data/heldout/sense-and-sensibility.jsonl]

CORPUS is the project's shared `austen.txt.gz` (Jane Austen's six novels, public domain;
default: $REQUANT_CORPUS, else ../shared/corpus/austen.txt.gz next to the checkout). The
trained default model never sees this novel (its training script holds it out), so its
perplexity here is a held-out measurement.

What is cut, and why: docs/eval.md#the-held-out-task-requant-heldout.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from pathlib import Path

from requant.io.output import write_bytes_atomic

TITLE_LINE = "SENSE AND SENSIBILITY"
TITLE_LINENO = 60799  # 1-based line of the title in the pinned corpus
CHAPTERS = 50
SOURCE_SHA256 = "1668bbdafc623c8e57b1ea98fc80934b3a9a3f657d82733d2f8e0d3a73427892"  # austen.txt.gz
OUTPUT_SHA256 = "87872dc34d74cf90f6ccef5a383d7e0d7ab5a35abdc1124c4cffc824678b5470"
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "data" / "heldout" / "sense-and-sensibility.jsonl"
_CHAPTER = re.compile(r"^CHAPTER (\d+)$")


def default_corpus() -> Path:
    env = os.environ.get("REQUANT_CORPUS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent.parent / "shared" / "corpus" / "austen.txt.gz"


def chapters(lines: list[str]) -> list[dict]:
    """The novel's chapters as documents, from the corpus' lines (no line ends)."""
    starts = [i for i, line in enumerate(lines) if line == TITLE_LINE]
    if len(starts) != 1:
        raise ValueError(f"expected one line {TITLE_LINE!r} in the corpus, found {len(starts)}")
    novel = lines[starts[0] :]
    heads = [(i, int(m.group(1))) for i, line in enumerate(novel) if (m := _CHAPTER.match(line))]
    if [n for _, n in heads] != list(range(1, CHAPTERS + 1)):
        raise ValueError(f"expected CHAPTER 1..{CHAPTERS} in order after the title, found {[n for _, n in heads]}")
    end = len(novel)
    while end > 0 and novel[end - 1].strip() in ("", "THE END"):
        end -= 1
    docs = []
    for k, (i, n) in enumerate(heads):
        stop = heads[k + 1][0] if k + 1 < len(heads) else end
        text = "\n".join(novel[i + 1 : stop]).strip("\n")
        if not text.strip():
            raise ValueError(f"chapter {n} is empty")
        docs.append({"title": f"Sense and Sensibility, Chapter {n}", "text": text})
    return docs


def render(docs: list[dict]) -> bytes:
    return "".join(json.dumps(d, sort_keys=True, ensure_ascii=True) + "\n" for d in docs).encode("ascii")


def make(corpus: Path, output: Path, *, check_source: bool = True) -> str:
    """Write the JSON lines atomically; return their sha256."""
    raw = Path(corpus).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if check_source and digest != SOURCE_SHA256:
        raise ValueError(f"{corpus}: sha256 {digest} is not the pinned corpus {SOURCE_SHA256}")
    lines = gzip.decompress(raw).decode("utf-8").split("\n")
    if check_source and lines[TITLE_LINENO - 1] != TITLE_LINE:
        raise ValueError(f"{corpus}: line {TITLE_LINENO} is not {TITLE_LINE!r}")
    data = render(chapters(lines))
    write_bytes_atomic(output, data)  # durable, with the permissions cp would give
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m requant.eval.heldout", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "corpus",
        nargs="?",
        type=Path,
        default=None,
        help="austen.txt.gz (default: $REQUANT_CORPUS or ../shared/corpus)",
    )
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT)
    a = ap.parse_args(argv)
    corpus = a.corpus or default_corpus()
    try:
        digest = make(corpus, a.output)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    note = "" if digest == OUTPUT_SHA256 else f"  (pinned OUTPUT_SHA256 is {OUTPUT_SHA256})"
    print(f"{a.output}: {CHAPTERS} chapters, sha256 {digest}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
