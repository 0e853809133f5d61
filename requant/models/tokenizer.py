"""The checkpoint's tokenizer, and a record of which one was used.

    tok = load_tokenizer(checkpoint_dir, vocab_size)
    tok.encode(text) -> list[int];  tok.decode(ids) -> str;  tok.eos_id -> int | None
    tok.describe() -> {"kind", "sha256", "vocab_size", "model_vocab_size"}

When byte-level ids are used, and where eos comes from: docs/runtime.md#tokenizer.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from requant.errors import CheckpointError
from requant.io.inputs import load_json, read_small
from requant.io.links import check_inside, shown

BYTE_LEVEL_MAX_VOCAB = 512
_byte_ids_allowed = False


@contextlib.contextmanager
def byte_ids_allowed(allowed: bool = True):
    """Within the block, every load_tokenizer uses byte-level ids for a checkpoint without
    tokenizer.json whatever its vocabulary (see the module docstring); restored on exit, so
    that one command's --byte-tokens never outlives it."""
    global _byte_ids_allowed
    before, _byte_ids_allowed = _byte_ids_allowed, bool(allowed)
    try:
        yield
    finally:
        _byte_ids_allowed = before


class TokenizerError(ValueError):
    """A tokenizer that cannot be used, with a message naming the file."""


def _read_json(path: Path):
    """A small JSON file beside the tokenizer (requant.io.inputs: a regular file, bounded, links inside)."""

    try:
        return load_json(path, what=path.name, root=path.parent)
    except CheckpointError as exc:
        raise TokenizerError(str(exc)) from None


def _id_list(value) -> tuple[int, ...]:
    """An `eos_token_id` value (an int or a non-empty list of ints) as a tuple; () otherwise."""
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(e, int) for e in value):
        return tuple(value)
    return ()


def _eos_ids(directory: Path | None, lookup) -> tuple[int, ...]:
    if directory is None:
        return ()
    gen = directory / "generation_config.json"
    if gen.is_file() and (ids := _id_list(_read_json(gen).get("eos_token_id"))):
        return ids
    tc = directory / "tokenizer_config.json"
    if tc.is_file() and lookup is not None:
        tok = _read_json(tc).get("eos_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str):
            i = lookup(tok)
            if i is not None:
                return (int(i),)
    cfg = directory / "config.json"
    if cfg.is_file():
        return _id_list(_read_json(cfg).get("eos_token_id"))
    return ()


class Tokenizer:
    """Text <-> token ids for one model (see the module docstring)."""

    def __init__(
        self,
        kind: str,
        vocab_size: int,
        *,
        backend=None,
        sha256: str | None = None,
        path: Path | None = None,
        eos_ids: tuple[int, ...] = (),
    ):
        self.kind = kind
        self.model_vocab_size = int(vocab_size)
        self.sha256 = sha256
        self.path = path
        self.eos_ids = tuple(eos_ids)
        self._tok = backend

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    @property
    def vocab_size(self) -> int:
        """The tokenizer's own vocabulary (tokenizer.json with added tokens; 256 bytes)."""
        if self._tok is not None:
            return int(self._tok.get_vocab_size(with_added_tokens=True))
        return 256

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            top = self.model_vocab_size - 1
            return [min(b, top) for b in text.encode("utf-8")]
        ids = self._tok.encode(text, add_special_tokens=False).ids
        bad = [i for i in ids if i >= self.model_vocab_size]
        if bad:
            raise TokenizerError(
                f"{self.path}: token id {bad[0]} is outside the model's vocabulary "
                f"(config.json vocab_size {self.model_vocab_size})"
            )
        return list(ids)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self._tok is not None:
            return self._tok.decode(ids, skip_special_tokens=False)
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(f"<|{i}|>")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "model_vocab_size": self.model_vocab_size,
        }

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, vocab {self.vocab_size}, model vocab {self.model_vocab_size})"


def load_tokenizer(checkpoint_dir, vocab_size: int, *, byte_level: bool = False) -> Tokenizer:
    """tokenizer.json from checkpoint_dir when it has one, else byte-level ids where they are
    the model's vocabulary or the caller says so (byte_level, byte_ids_allowed), else a
    TokenizerError (see the module docstring). checkpoint_dir may be None (byte-level)."""
    directory = Path(checkpoint_dir) if checkpoint_dir is not None else None
    path = directory / "tokenizer.json" if directory is not None else None
    if path is None or not (path.exists() or path.is_symlink()):
        if directory is not None and int(vocab_size) > BYTE_LEVEL_MAX_VOCAB and not (byte_level or _byte_ids_allowed):
            raise TokenizerError(
                f"{shown(path)}: missing, and the model's vocabulary ({int(vocab_size)} ids) is not the "
                f"byte-level one (at most {BYTE_LEVEL_MAX_VOCAB}): put the checkpoint's tokenizer.json "
                "back, or pass --byte-tokens to use UTF-8 byte values as token ids"
            )
        return Tokenizer("byte-level", vocab_size, eos_ids=_eos_ids(directory, None))
    if path.is_symlink():
        check_inside(directory, path)
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise TokenizerError(f"{path}: the `tokenizers` library is not installed (pip install tokenizers)") from None

    try:  # a regular file, bounded (a FIFO or a device named tokenizer.json is refused, not waited on)
        raw = read_small(path, what="tokenizer.json", root=directory)
    except CheckpointError as exc:
        raise TokenizerError(str(exc)) from None
    try:
        backend = HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # the library raises its own Exception subclasses for bad files
        raise TokenizerError(f"{path}: not a tokenizer the `tokenizers` library can load: {exc}") from None
    return Tokenizer(
        "tokenizer.json",
        vocab_size,
        backend=backend,
        sha256=hashlib.sha256(raw).hexdigest(),
        path=path,
        eos_ids=_eos_ids(directory, backend.token_to_id),
    )


def summary(desc: dict | str) -> str:
    """One line for a report from describe()'s dict (an older report's plain kind string too)."""
    if isinstance(desc, str):
        return f"{desc} tokenizer"
    if desc.get("kind") == "tokenizer.json":
        return f"tokenizer.json (sha256 {desc.get('sha256')}, {desc.get('vocab_size')} ids)"
    return (
        f"byte-level ids (the checkpoint has no tokenizer.json: token id = UTF-8 byte"
        f"{', clipped to ' + str(desc['model_vocab_size'] - 1) if desc.get('model_vocab_size', 256) < 256 else ''})"
    )
