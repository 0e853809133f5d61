"""Which requant made a report: the tool version, and the git commit when run from a checkout.

Every report that is evidence about a checkpoint (the audit, the eval, the determinism run)
records the code that produced it, so that a stranger can tell which numbers came from which
tool. The version alone is not enough while requant is developed from a git checkout (many
commits share 0.1.0), so a checkout adds its commit (the rules: docs/publishing.md#reports-carry-their-provenance).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import requant

_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # sha1 or sha256 object names
_DECLARED = re.compile(r"^[0-9a-f]{7,64}(-dirty)?$")
_GIT_TIMEOUT_S = 10


def tool_version() -> str:
    """requant's version string (requant.__version__)."""
    return requant.__version__


def _git(root: Path, *args: str) -> str | None:
    # GIT_DIR / GIT_WORK_TREE from a calling git hook would point git at another repository.
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env["GIT_OPTIONAL_LOCKS"] = "0"  # `git status` must not take the index lock of a checkout in use
    try:
        res = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git binary, or it hung
        return None
    return res.stdout if res.returncode == 0 else None


def source_root() -> Path:
    """The directory above the imported `requant` package (a checkout's root, or site-packages)."""
    return Path(requant.__file__).resolve().parent.parent


def git_commit(root: str | os.PathLike | None = None) -> str | None:
    """The commit of requant's checkout ('<40 hex>' or '<40 hex>-dirty'), or None (see the module doc)."""
    declared = os.environ.get("REQUANT_COMMIT", "").strip()
    if _DECLARED.match(declared):
        return declared
    root = Path(root) if root is not None else source_root()
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    if _git(root, "ls-files", "--error-unmatch", "requant/__init__.py") is None:
        return None  # not requant's own repository
    head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head is None or not _COMMIT.match(head.strip()):
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if status is None:
        return None
    return head.strip() + ("-dirty" if status.strip() else "")


def build_info() -> dict:
    """{"tool_version": ..., "git_commit": ...}: the keys every requant report carries."""
    return {"tool_version": tool_version(), "git_commit": git_commit()}
