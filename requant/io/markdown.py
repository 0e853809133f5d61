"""The one Markdown table writer every report uses."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> list[str]:
    """Lines of a Markdown table: `| a | b |`, the separator, one line per row (cells str()-ed).
    align: one character per column, "r" right-aligned (`---:`), anything else `---`; columns
    past its end are left-aligned."""
    seps = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    return [_line(header), _line(seps), *(_line(r) for r in rows)]


def _line(cells: Sequence) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
