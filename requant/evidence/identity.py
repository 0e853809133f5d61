"""What ties a report to the bytes it measured and to the code that measured them.

Every report that is evidence about a checkpoint (`requant audit`, `requant eval`,
`requant determinism`) carries the same four keys, so that a model card (requant.publish)
can quote its numbers for exactly these bytes, or say that it cannot:

    manifest, manifest_digest   requant.evidence.manifest.identity: the checkpoint's SHA256SUMS,
                                checked against the files first, or, when it has none, the
                                digest of the manifest computed now ("manifest": null)
    tool_version, git_commit    requant.evidence.buildinfo.build_info

The commands compute them before the long run: a SHA256SUMS that does not match the files
stops the command there (a usage/checkpoint error naming the first differing, missing or
unlisted file), so a report never claims a digest for bytes it did not read. Hashing reads
every file once (a few seconds per GB); `with_progress` shows a byte bar for it on stderr.
"""

from __future__ import annotations

from typing import Callable

from requant.evidence.buildinfo import build_info
from requant.evidence.manifest import covered_files, identity


def bytes_to_hash(ckpt) -> int:
    """Bytes of the files checkpoint_identity hashes (a progress bar's total for it): the files the
    manifest covers, not every file under the directory (a card or a report is not hashed, and a
    total that counted them would leave the bar short of complete)."""
    return sum(p.stat().st_size for p in covered_files(ckpt.path).values())


def checkpoint_identity(ckpt, progress: Callable[[int], None] | None = None, entries_out: dict | None = None) -> dict:
    """{manifest, manifest_digest, tool_version, git_commit} of an opened checkpoint (anything
    with a `.path`; without one the manifest keys are None). entries_out: see
    requant.evidence.manifest.identity."""
    path = getattr(ckpt, "path", None)
    ident = (
        identity(path, progress=progress, entries_out=entries_out)
        if path is not None
        else {"manifest": None, "manifest_digest": None}
    )
    return {**ident, **build_info()}


def with_progress(ckpt, console) -> dict:
    """checkpoint_identity with a transient byte bar on `console` (a rich Console on stderr;
    shown only on a terminal)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    total = bytes_to_hash(ckpt)
    with Progress(
        TextColumn("manifest digest (sha256 of every file)"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("sha256", total=total)
        return checkpoint_identity(ckpt, progress=lambda n: progress.advance(task, n))


def markdown_lines(result: dict) -> list[str]:
    """The two Markdown bullets every report prints for these keys."""
    return [
        f"- checkpoint manifest digest: `{result.get('manifest_digest')}` "
        f"({'its ' + result['manifest'] if result.get('manifest') else 'computed; the checkpoint has no SHA256SUMS'})",
        f"- requant {result.get('tool_version')}, git commit `{result.get('git_commit') or 'none (not a git checkout)'}`",
    ]
