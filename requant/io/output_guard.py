"""No output lands on an input: the rule every command's output paths pass through.

`check_outputs(outputs, inputs)` refuses (UsageError naming the option and the input), before
any work:

* an output that resolves (symlinks followed, `..` collapsed) to an input file, or that is the
  same file as one (st_dev/st_ino: a hard link);
* an output inside an input directory (a checkpoint, a bf16 --source), or an output directory
  replaced whole (convert's -o) that contains an input: a report written into a checkpoint would change the bytes its
  manifest lists, or overwrite its weights. The one exception is a checkpoint's report slots
  (`slots`: the top-level requant-*.json names the manifest does not cover,
  requant.evidence.manifest.REPORTS), where the Quickstart keeps each report beside the bytes
  it describes;
* two outputs that are the same file (the second would silently replace the first);
* an output file that is a symbolic link, wherever it leads: requant writes a report to a regular
  file or a new name, never through a link (a link to another checkpoint's config.json would
  replace it; that checkpoint is no input of the run, so no rule above sees it). Remove the link
  or name another file. The checks above run first, so a link onto an input is named as that.

Outputs are (option, path, files): `files` are the names a report directory gets (each
checked as a file output), None for a file output, () for a directory replaced whole. Inputs are (label, path, slots): paths
that do not exist locally (a Hub repo id) are skipped. docs/architecture.md ("Outputs").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

from requant.errors import UsageError
from requant.io.links import shown

__all__ = ["check_outputs", "real_path"]

# how many files of an input directory are compared by inode (a checkpoint has a few dozen)
MAX_FILES_COMPARED = 10_000


def real_path(path: str | os.PathLike) -> Path:
    """Where `path` leads: every symlink followed (the last one too), `..` collapsed; a
    missing tail is kept as spelled."""
    return Path(os.path.realpath(os.path.abspath(path)))


def _inode(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _files_of(root: Path) -> Iterable[Path]:
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            n += 1
            if n > MAX_FILES_COMPARED:
                return
            yield Path(dirpath) / f


def check_outputs(
    outputs: Iterable[tuple[str, Optional[os.PathLike], Optional[tuple[str, ...]]]],
    inputs: Iterable[tuple[str, Optional[os.PathLike], Iterable[str]]],
) -> None:
    """UsageError unless no output lands on or inside an input and no two outputs are one file
    (see the module docstring). Outputs: (option, path, files), `files` None for a file output, a
    tuple for a directory output. Inputs: (label, path, slots), `slots` the top-level names an
    output may take inside that input directory."""
    rows = []
    for option, path, files in outputs:
        if path is None:
            continue
        rows.append((option, Path(path), real_path(path), "file" if files is None else "tree" if not files else "dir"))
        for name in files or ():
            rows.append((option, Path(path) / name, real_path(Path(path) / name), "file"))
    for label, given, slots in inputs:
        if given is None or not os.path.lexists(given):
            continue
        slots = frozenset(slots)
        top = real_path(given)
        is_dir = top.is_dir()
        inodes = None
        for option, path, real, kind in rows:
            what = f"{option} {shown(path)}"
            if real == top:
                raise UsageError(f"{what}: is {label} {shown(given)}; requant never writes over an input")
            # a report slot beside the checkpoint's bytes (not covered by its manifest) is allowed
            slot = kind == "file" and real.parent == top and real.name in slots
            if is_dir and top in real.parents and not slot:
                raise UsageError(f"{what}: inside {label} {shown(given)}; requant never writes into an input")
            if kind == "tree" and real in top.parents:  # a directory output replaced whole
                raise UsageError(f"{what}: contains {label} {shown(given)}; requant never writes over an input")
            ino = _inode(real)
            if ino is None or kind != "file":
                continue
            if not is_dir:
                if ino == _inode(top):
                    raise UsageError(f"{what}: is the same file as {label} {shown(given)} (a hard link)")
                continue
            if inodes is None:
                inodes = {}
                for f in _files_of(top):
                    inodes.setdefault(_inode(f), []).append(f)
            others = [f for f in inodes.get(ino, []) if real_path(f) != real]  # a slot is one of them itself
            if others:
                raise UsageError(
                    f"{what}: is the same file as {shown(others[0])} of {label} {shown(given)} (a hard link)"
                )
    seen: dict = {}
    for option, path, real, kind in rows:
        if kind != "file":
            continue
        keys = [real] + ([_inode(real)] if _inode(real) is not None else [])
        for key in keys:
            if key in seen:
                other_option, other = seen[key]
                raise UsageError(
                    f"{option} {shown(path)}: the same file as {other_option} {shown(other)}; each output needs its own"
                )
        for key in keys:
            seen[key] = (option, path)
    for option, path, _real, kind in rows:
        if kind == "file" and path.is_symlink():
            raise UsageError(
                f"{option} {shown(path)}: is a symbolic link (to {shown(os.readlink(path))}); requant never writes "
                "an output through a link (remove it, or name another file)"
            )
