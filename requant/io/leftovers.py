"""What a killed run leaves, recognised by its name and swept by the next run, with a note.

Every temporary file requant makes beside a file it writes is named
`.NAME.requant-tmp-PID-RANDOM...` (old copies kept for a roll back: `.NAME.requant-old-PID-...`),
PID being the writer's process id. Such a name is never part of a checkpoint: the manifest never
counts or records one (requant.evidence.manifest.walk_files), and once its writer is dead
(no process with that PID on this machine) it is removed, and the caller told. A temporary whose
writer lives is left alone: it is another run's work in progress.

Why the PID in the name and not a lock: a file killed at its creation has no lock to take yet;
the name is written atomically with the file (mkstemp's O_EXCL).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

TEMP = re.compile(r"^\..+\.requant-(?:tmp|old)-(?P<pid>\d+)-[^/]*$")
EVAL_PREFIX = "requant-eval-"  # $TMPDIR/requant-eval-PID-RANDOM: eval's converted arms


def tag(kind: str = "tmp") -> str:
    """The middle of a temporary's name for this process: 'requant-tmp-PID-'."""
    return f"requant-{kind}-{os.getpid()}-"


def owner_alive(pid: int) -> bool:
    """Whether a process with this id runs here (EPERM: it runs, as another user)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def is_temp(name: str) -> bool:
    return TEMP.match(name) is not None


def dead_temp(name: str) -> bool:
    """A requant temporary whose writer is gone."""
    m = TEMP.match(name)
    return m is not None and not owner_alive(int(m.group("pid")))


def _note(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


note: Callable[[str], None] = _note  # where sweep notes go (the CLI points it at its warning line)


def sweep(path: Path, shown: str | None = None) -> bool:
    """Remove `path` (a dead writer's temporary file) with a note; True when it is gone."""
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return True
    except OSError as exc:
        note(f"{shown or path}: left by a run that was killed; could not be removed ({exc.strerror}): remove it")
        return False
    pid = TEMP.match(path.name).group("pid")
    note(f"removed {shown or path}: {size:,} bytes left by a run that was killed (pid {pid})")
    return True


def sweep_beside(path: Path) -> None:
    """Remove the dead writers' temporaries of `path` (files named .NAME.requant-*-PID-*)."""
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    prefix = f".{path.name}.requant-"
    for p in sorted(entries):
        if p.name.startswith(prefix) and dead_temp(p.name) and p.is_file() and not p.is_symlink():
            sweep(p)


def eval_dir() -> Path:
    """A new temporary directory for eval's converted arms, named with this process's PID; the
    ones dead evals left in the same place are swept first."""
    root = Path(tempfile.gettempdir())
    try:
        for d in sorted(root.glob(EVAL_PREFIX + "*")):
            m = re.match(re.escape(EVAL_PREFIX) + r"(\d+)-", d.name)
            if m and d.is_dir() and not d.is_symlink() and not owner_alive(int(m.group(1))):
                size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())
                shutil.rmtree(d, ignore_errors=True)
                note(f"removed {d}: {size:,} bytes left by an eval that was killed (pid {m.group(1)})")
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"{EVAL_PREFIX}{os.getpid()}-"))
