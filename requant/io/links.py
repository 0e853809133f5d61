"""Which links inside a checkpoint directory requant follows.

A checkpoint is the bytes under its directory. A symlink whose target lies outside that
directory would make requant copy, hash, publish or read a file that is not part of the
checkpoint (a `notes.txt -> ~/.ssh/id_rsa` would be copied into a converted output and
uploaded by push), so every reader, hasher, copier and uploader refuses one, naming the link
and where it leads. Links between files of the same checkpoint are followed.

The one exception is the Hugging Face cache's own layout, which is what a repo id resolves
to: `models--OWNER--NAME/snapshots/REVISION/FILE` is a relative link to
`models--OWNER--NAME/blobs/SHA`. A file of a directory named `snapshots/REVISION` may link
into the `blobs` directory beside `snapshots`, and nowhere else outside.
"""

from __future__ import annotations

import os
from pathlib import Path

from requant.errors import LayoutError

__all__ = ["LinkError", "check_inside", "shown"]


class LinkError(LayoutError):
    """A file of a checkpoint that resolves to a place outside the checkpoint."""


def shown(path) -> str:
    """A path for a one-line message: as is, or as Python's repr when it holds a control
    character (a newline in a file name must not split the line)."""
    s = str(path)
    return repr(s) if any(ord(c) < 32 or ord(c) == 127 for c in s) else s


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def allowed_roots(root: str | os.PathLike) -> tuple[Path, ...]:
    """The real directories that files of `root` may resolve into: root itself and, for a
    Hugging Face cache snapshot, the repo's blobs directory."""
    real = Path(root).resolve()
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return tuple(roots)


def check_inside(root: str | os.PathLike, path: str | os.PathLike, roots: tuple[Path, ...] | None = None) -> Path:
    """path's real location, or LinkError when a link takes it outside root (see the module
    docstring). `roots` (from allowed_roots) saves resolving root again for every file."""
    roots = roots or allowed_roots(root)
    p = Path(path)
    real = p.resolve()
    if any(_within(real, r) for r in roots):
        return real
    raise LinkError(
        f"links to {shown(real)}, outside the checkpoint {shown(roots[0])}; requant follows no link out of "
        "a checkpoint (copy the file in instead)",
        file=shown(p),
    )
