"""Token streams for training and validation, and the batches drawn from them.

The committed tokenizer (its sha256 checked against the pinned one) encodes the documents
of training/texts.py's split into two streams of uint16 ids, with `<|endoftext|>` before
every document and one at the end (lm-eval's rolling log-likelihood likewise conditions a
document's first token on the end-of-text token). About 1.92M training and 42k validation
tokens. The streams' sha256 are pinned (made here with tokenizers 0.23.3): the GPU machine
reports whether it sees the same data.

Training batches: every epoch starts the windows (seq_len + 1 tokens: inputs and next-token
targets) at a random offset into the stream and visits them in a random order, from one
numpy Generator(seed). Validation: non-overlapping windows that cover every target token
(the last one may be shorter).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import torch

from training import texts
from training.train_tokenizer import TOKENIZER_DIR, TOKENIZER_SHA256, sha256_file

STREAM_SHA256 = {
    "train": "52824d4058b7cb83d3f4fa6fbd4d49045c86c5d57304415901de871009f114c7",  # 1,919,879 tokens
    "val": "ebe59df605624a90ad51ed8ce416525e49b406320e0986b7979a292458a136f0",  # 41,679 tokens
}


class UsageError(Exception):
    """Bad input: reported as one line naming the file or flag, exit status 2."""


def load_tokenizer(tokenizer_dir: Path = TOKENIZER_DIR):
    from tokenizers import Tokenizer

    tok_file = Path(tokenizer_dir) / "tokenizer.json"
    if not tok_file.is_file():
        raise UsageError(f"{tok_file}: tokenizer file missing")
    digest = sha256_file(tok_file)
    if digest != TOKENIZER_SHA256:
        raise UsageError(f"{tok_file}: sha256 {digest} is not the pinned {TOKENIZER_SHA256}")
    return Tokenizer.from_file(str(tok_file))


def encode_documents(tok, docs: list[texts.Document]) -> np.ndarray:
    """uint16 ids: `<|endoftext|>`, document, `<|endoftext|>`, document, ..., `<|endoftext|>`."""
    eot = tok.token_to_id(texts.EOT)
    ids: list[int] = []
    for enc in tok.encode_batch([d.text for d in docs], add_special_tokens=False):
        ids.append(eot)
        ids.extend(enc.ids)
    ids.append(eot)
    if max(ids) >= 1 << 16:
        raise ValueError("token id does not fit uint16")
    return np.asarray(ids, dtype=np.uint16)


@functools.lru_cache(maxsize=2)
def _cached_streams(tokenizer_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    tok = load_tokenizer(tokenizer_dir)
    train_docs, val_docs = texts.split(texts.training_documents())
    out = (encode_documents(tok, train_docs), encode_documents(tok, val_docs))
    for a in out:
        a.setflags(write=False)  # shared between callers in one process (tests): read-only
    return out


def token_streams(tokenizer_dir: Path = TOKENIZER_DIR) -> dict[str, np.ndarray]:
    """{"train", "val"}: the two token streams (read-only arrays, encoded once per process)."""
    train, val = _cached_streams(Path(tokenizer_dir).resolve())
    return {"train": train, "val": val}


def stream_digest(a: np.ndarray) -> str:
    """sha256 of the ids as little-endian uint16."""
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<u2").tobytes()).hexdigest()


class Batches:
    """Seeded epochs of shuffled windows over the training stream (a 1-D tensor on the device)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch: int, seed: int):
        self.stream, self.seq_len, self.batch = stream, seq_len, batch
        self.rng = np.random.default_rng(seed)
        self.arange = torch.arange(seq_len + 1, device=stream.device)
        self.epoch, self.queue = 0, np.empty(0, dtype=np.int64)
        if self.steps_per_epoch() < 1:
            raise UsageError(
                f"the training stream ({len(stream)} tokens) is shorter than one batch of {batch} x {seq_len}"
            )

    def steps_per_epoch(self) -> int:
        """Whole batches per epoch at the largest offset (seq_len - 1): a lower bound for every epoch."""
        return ((len(self.stream) - self.seq_len) // self.seq_len) // self.batch

    def _new_epoch(self) -> None:
        offset = int(self.rng.integers(self.seq_len))
        n = (len(self.stream) - 1 - offset) // self.seq_len  # windows that fit after the offset
        order = offset + self.seq_len * self.rng.permutation(n)
        self.queue = order[: (n // self.batch) * self.batch]  # whole batches only
        self.epoch += 1

    def next(self) -> torch.Tensor:
        """[batch, seq_len + 1] int64 token ids."""
        if len(self.queue) == 0:
            self._new_epoch()
        starts, self.queue = self.queue[: self.batch], self.queue[self.batch :]
        idx = torch.as_tensor(starts, device=self.stream.device)[:, None] + self.arange[None, :]
        return self.stream[idx].long()


def val_windows(stream: torch.Tensor, seq_len: int, limit: int | None = None) -> list[torch.Tensor]:
    """Windows of up to seq_len + 1 tokens, stride seq_len: each target token exactly once."""
    wins = [stream[s : s + seq_len + 1].long() for s in range(0, len(stream) - 1, seq_len)]
    return wins[:limit] if limit else wins
