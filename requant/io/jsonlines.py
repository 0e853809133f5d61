"""The one reader of JSON-lines files a user hands to requant: `--prompts` and generation records.

read_json_lines(path) -> [(line number, value)], every refusal one `error` naming the file
(and the line):
  * the file: "no such file" when it is missing; a regular file only (a FIFO would block, /dev/zero never end), at most
    MAX_FILE_BYTES, read with requant.inputs.read_small (bounded, non-blocking open);
  * lines: split on b"\\n" only (U+2028, U+0085 and a lone \\r are characters of a line, as
    in JSON), each at most MAX_LINE_BYTES, blank lines skipped;
  * each line: strict UTF-8, valid JSON without NaN or Infinity, nested at most MAX_DEPTH deep,
    no string (key or value) holding a lone surrogate (JSON's "\\ud800" escape decodes to one,
    and it cannot be written back as UTF-8).
What each field must be is the caller's (requant.commands.generate, requant.runtime.generation),
with the location this reader gives: `where(path, n)`.
"""

from __future__ import annotations

import json
import os
import re

from requant.errors import CheckpointError
from requant.io.inputs import read_small
from requant.io.links import shown

__all__ = ["MAX_FILE_BYTES", "MAX_LINE_BYTES", "MAX_DEPTH", "read_json_lines", "where", "has_surrogate"]

MAX_FILE_BYTES = 256 << 20  # a record of 2,048 steps is about 0.3 MB: 800 of them fit
MAX_LINE_BYTES = 16 << 20  # one record, or one prompt of 2,048 positions, is far less
MAX_DEPTH = 32  # a record nests 3 deep

_SURROGATE = re.compile("[\ud800-\udfff]")


def where(label: str, n: int) -> str:
    return f"{label}:{n}"


def has_surrogate(s: str) -> bool:
    return _SURROGATE.search(s) is not None


def _constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_value(value, loc: str, error) -> None:
    """Depth and lone surrogates, iteratively (a deep value must not exhaust the stack here)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if has_surrogate(v):
                raise error(f"{loc}: a string holds a lone surrogate ({ascii(v)[:40]}), not valid Unicode text")
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise error(f"{loc}: JSON nested more than {MAX_DEPTH} deep")
            if isinstance(v, dict):
                for k, x in v.items():
                    stack.append((k, depth))
                    stack.append((x, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in v)


def read_json_lines(path: str | os.PathLike, *, label: str | None = None, error=ValueError) -> list[tuple[int, object]]:
    """The (line number, parsed value) of every non-blank line (module docstring); `error`
    (an exception class taking one message) naming `label` (default: the path) otherwise."""
    label = label if label is not None else shown(path)
    if not os.path.exists(path):  # one wording for a missing input file, whichever command reads it
        raise error(f"{label}: no such file" + (" (a link to nothing)" if os.path.islink(path) else ""))
    try:
        data = read_small(path, what="file", limit=MAX_FILE_BYTES)
    except CheckpointError as exc:
        raise error(f"{label}: {exc.detail}") from None
    out = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        loc = where(label, n)
        if len(raw) > MAX_LINE_BYTES:
            raise error(f"{loc}: the line is {len(raw):,} bytes, more than the {MAX_LINE_BYTES:,} requant reads")
        try:
            text = raw.decode("utf-8")  # strict: an encoded surrogate or a bad byte is refused
        except UnicodeDecodeError as exc:
            raise error(f"{loc}: not UTF-8 text (byte {exc.start + 1} of the line)") from None
        try:
            value = json.loads(text, parse_constant=_constant)
        except RecursionError:
            raise error(f"{loc}: JSON nested more than {MAX_DEPTH} deep") from None
        except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer of too many digits
            raise error(f"{loc}: not valid JSON: {exc}") from None
        _check_value(value, loc, error)
        out.append((n, value))
    return out
