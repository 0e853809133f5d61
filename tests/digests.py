"""An independent manifest digest for tests: hashlib over the files, sha256sum lines by hand."""

from __future__ import annotations

import hashlib
from pathlib import Path


def manifest_digest_by_hand(root: Path) -> str:
    """sha256 of the sha256sum lines of every file but the evidence (top-level SHA256SUMS,
    README.md, .gitattributes, requant-*.json), sorted by relative path's bytes."""
    root = Path(root)
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    rels = [
        r
        for r in rels
        if r not in ("SHA256SUMS", "README.md", ".gitattributes") and not (r.startswith("requant-") and "/" not in r)
    ]
    lines = "".join(
        f"{hashlib.sha256((root / r).read_bytes()).hexdigest()}  {r}\n" for r in sorted(rels, key=str.encode)
    )
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
