"""The --force policy of a conversion's OUT: OUT never inside SRC (nor SRC inside OUT), and an
existing OUT replaced only when it is a checkpoint (requant.io.output.replaceable) holding nothing
a user wrote into it (not_replaced_silently), checked before any work (check_output) and again
just before the rename (refuse_users_files, AtomicOutput's before_replace). Here, not in
requant.io.output, because it reads the manifest and the conversion's own stub
(docs/checkpoints.md#reading-and-writing-the-decisions).
"""

from __future__ import annotations

from pathlib import Path

from requant.convert._streaming import readme_stub
from requant.errors import OutputError
from requant.evidence import manifest as mf
from requant.io.links import shown
from requant.io.output import output_path, refuse_unless_replaceable
from requant.scales import ARMS

__all__ = ["CONVERSION_FILES", "EVIDENCE_FILES", "not_replaced_silently", "check_output", "refuse_users_files"]


# What a conversion writes itself (besides the files it copies or rewrites from SRC).
CONVERSION_FILES = frozenset({"SHA256SUMS", "SHA256SUMS.source", "requant-convert.json", ".gitattributes"})
# Evidence written about an output after it was made: the card and the reports of audit, eval, determinism.
EVIDENCE_FILES = ("README.md", "requant-audit.json", "requant-eval.json", "requant-determinism.json")


def _written_by_conversion(path: Path, theirs: Path) -> bool:
    """An evidence-named file of an old OUT that a conversion put there: SRC's own file copied,
    or the README stub a constrained arm writes (requant.convert._streaming.readme_stub)."""
    try:
        if path.stat().st_size > 1 << 20:
            return False
        data = path.read_bytes()
        if theirs.is_file() and theirs.read_bytes() == data:
            return True
    except OSError:
        return False
    return path.name == "README.md" and any(data.endswith(readme_stub(b"", arm)) for arm in ARMS)


def not_replaced_silently(final: Path, src: Path) -> list[str]:
    """The files of an existing OUT that --force must not delete (docs/checkpoints.md):
    the evidence written about it (EVIDENCE_FILES at its top level, unless a conversion wrote it:
    _written_by_conversion) and, when OUT has a
    SHA256SUMS, every file it neither lists nor wrote itself (CONVERSION_FILES)."""
    if final.is_symlink() or not final.is_dir():
        return []
    files = mf.walk_files(final, skip_dirs=frozenset())
    stored = mf.read(final)
    listed = set(stored[0]) if stored is not None else None
    kept = []
    for rel, path in sorted(files.items()):
        if rel in CONVERSION_FILES:
            continue
        if rel in EVIDENCE_FILES:
            if not _written_by_conversion(path, src / rel):
                kept.append(rel)
        elif listed is not None and rel not in listed:
            kept.append(rel)
    return kept


def check_output(src: Path, out: Path, force: bool) -> None:
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise OutputError(f"output would be inside the source checkpoint {s}; requant never writes there", file=out)
    if o in s.parents:
        raise OutputError(f"output contains the source checkpoint {s}; replacing it would destroy the source", file=out)
    if out.exists() or out.is_symlink():
        if not force:
            raise OutputError("already exists; pass --force to replace it", file=out)
        refuse_unless_replaceable(out, output_path(out))
        refuse_users_files(out, output_path(out), src)


def refuse_users_files(out: Path, final: Path, src: Path) -> None:
    """OutputError naming the files of an existing OUT that --force must not delete (not_replaced_silently)."""
    kept = not_replaced_silently(final, src)
    if kept:
        more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
        raise OutputError(
            f"holds files a conversion did not write ({', '.join(shown(k) for k in kept[:5])}{more}): "
            "--force never deletes them; move them out of it first, or choose another output",
            file=out,
        )
