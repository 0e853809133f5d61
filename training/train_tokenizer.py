"""Train the default model's tokenizer: byte-level BPE, 8,192 tokens, on the training split only.

Design (Qwen2/Qwen3's tokenizer, minus its NFC normalizer):
  * pre-tokenizer: Qwen2's split regex (contractions, letter runs with one leading
    non-letter, single digits, punctuation runs, newline runs, spaces), then byte-level
    mapping with no prefix space; decoder: byte-level. No normalizer, so decode(encode(x))
    == x for every string (Qwen's NFC would change non-NFC input).
  * one special token, `<|endoftext|>` = id 0: document separator, eos, bos and pad (as in
    the Qwen3 base models, where one end-of-text token plays all these roles).
  * ids 1..256 are the 256 byte symbols (the full byte alphabet, so any text encodes), then
    the merges in the order learned, up to 8,192 in all.
  * trained on the training split's documents (training.texts.split) only: the held-out
    novel and the validation chapters are never seen.
Determinism: tokenizers' BPE trainer counts pairs in parallel (rayon) and picks merges from a
heap ordered by (count, then the pair itself), so equal counts are not resolved by thread
timing. Measured here (tokenizers 0.23.3, 2 cores): RAYON_NUM_THREADS=1 and =2, two runs
each, gave the same tokenizer.json sha256, in about 4 s per training. The script still sets
RAYON_NUM_THREADS=1 (unless set) and `--check` compares the result with the pinned sha256
of the committed file.

Writes tokenizer.json, tokenizer_config.json (PreTrainedTokenizerFast: AutoTokenizer loads
it) and generation_config.json into --out (default training/tokenizer/).

Usage: python3 training/train_tokenizer.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from requant.io.output import write_bytes_atomic  # noqa: E402
from training import texts  # noqa: E402

TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"
VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 2048
# sha256 of the committed tokenizer.json (training/tokenizer/); a retraining must reproduce it.
TOKENIZER_SHA256 = "9f3a074379204c1fcd20099deb04428cf5fbe03c1ad25030f66a758ff32f58e3"
# Qwen2/Qwen3's pre-tokenizer split pattern (from their tokenizer.json).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer():
    """An untrained tokenizer with the pipeline above."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()  # decoding maps byte symbols back to bytes; its options act on offsets only
    return tok


def train(docs: list[texts.Document]):
    """Train on the given documents' texts; returns the tokenizers.Tokenizer."""
    from tokenizers import pre_tokenizers, trainers

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[texts.EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((d.text for d in docs), trainer=trainer, length=len(docs))
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained vocabulary has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    if tok.token_to_id(texts.EOT) != 0:
        raise RuntimeError(f"{texts.EOT} is not id 0")
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": texts.EOT,
        "eos_token": texts.EOT,
        "pad_token": texts.EOT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "right",
    }


def generation_config(eot_id: int = 0) -> dict:
    return {"bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id, "do_sample": False}


def _dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write(tok, out: Path) -> None:
    """Write the three files into out (created if missing); each one atomically."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": _dump(tokenizer_config()),
        "generation_config.json": _dump(generation_config(tok.token_to_id(texts.EOT))),
    }
    for name, content in files.items():
        write_bytes_atomic(out / name, content.encode("utf-8"))


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    ap.add_argument("--check", action="store_true", help="exit 1 unless tokenizer.json has the pinned sha256")
    a = ap.parse_args(argv)
    # one rayon thread unless set (takes effect if tokenizers has not started its pool yet)
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    t0 = time.perf_counter()
    try:
        train_docs, _ = texts.split(texts.training_documents())
    except texts.CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    tok = train(train_docs)
    write(tok, a.out)
    digest = sha256_file(a.out / "tokenizer.json")
    print(
        json.dumps(
            {
                "out": str(a.out),
                "vocab": tok.get_vocab_size(),
                "documents": len(train_docs),
                "tokenizer_json_sha256": digest,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )
    if a.check and digest != TOKENIZER_SHA256:
        print(
            f"error: {a.out / 'tokenizer.json'}: sha256 {digest} is not the pinned {TOKENIZER_SHA256}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
