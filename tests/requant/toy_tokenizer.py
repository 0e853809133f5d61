"""A small byte-level BPE tokenizer.json built (not trained: fixed merges, so the file is
the same on every machine) with the `tokenizers` library: 256 byte tokens, two merges
("Ġt", "Ġth") and the special <|endoftext|> (id 258); 259 ids, so it fits the embedded
default's vocabulary of 512."""

from pathlib import Path

EOT = "<|endoftext|>"


def write_byte_bpe(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({"Ġt": 256, "Ġth": 257})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t"), ("Ġt", "h")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return path
