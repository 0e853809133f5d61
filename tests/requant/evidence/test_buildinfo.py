"""requant.evidence.buildinfo: the git commit of a checkout, `-dirty` for tracked changes, None otherwise.

Independent reference: the commit id that `git commit` made in a throwaway repository, read
with `git log` (a different git command from the one buildinfo runs)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import requant
from requant.evidence.buildinfo import build_info, git_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git binary")


@pytest.fixture(autouse=True)
def _no_declared_commit(monkeypatch):
    monkeypatch.delenv("REQUANT_COMMIT", raising=False)


def _git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        check=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(root),
            "PATH": "/usr/bin:/bin:/usr/local/bin",
        },
    ).stdout


def _checkout(tmp_path):
    root = tmp_path / "checkout"
    (root / "requant").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'requant'\n")
    (root / "requant" / "__init__.py").write_text("__version__ = '0'\n")
    _git(root, "init", "-q")
    return root


def test_commit_dirty_and_untracked(tmp_path):
    root = _checkout(tmp_path)
    assert git_commit(root) is None  # no commit yet: never the word HEAD
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    head = _git(root, "log", "-1", "--format=%H").strip()
    assert git_commit(root) == head and len(head) == 40
    (root / "notes.txt").write_text("untracked")
    assert git_commit(root) == head  # untracked files do not make it dirty (git describe --dirty)
    (root / "requant" / "__init__.py").write_text("__version__ = '1'\n")
    assert git_commit(root) == head + "-dirty"


def test_not_a_checkout_or_not_requants(tmp_path):
    assert git_commit(tmp_path) is None  # no .git
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text("")
    (other / "x.txt").write_text("x")
    _git(other, "init", "-q")
    _git(other, "add", "-A")
    _git(other, "commit", "-qm", "x")
    assert git_commit(other) is None  # a repository that does not track requant/__init__.py


def test_build_info_keys():
    info = build_info()
    assert info["tool_version"] == requant.__version__
    assert info["git_commit"] is None or info["git_commit"].split("-")[0].isalnum()
    assert info["git_commit"] != "HEAD"


def test_declared_commit_wins_over_a_stale_copy(tmp_path, monkeypatch):
    """The GPU machine's case: a copied tree whose .git names an older commit (and so calls the
    copy dirty). REQUANT_COMMIT, when it is a commit id, is what the report records; a value
    that is not one (a branch name, the word HEAD) is ignored. Reference: git log's commit id."""
    root = _checkout(tmp_path)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    head = _git(root, "log", "-1", "--format=%H").strip()
    (root / "requant" / "__init__.py").write_text("__version__ = '1'\n")
    assert git_commit(root) == head + "-dirty"
    monkeypatch.setenv("REQUANT_COMMIT", "911a490")
    assert git_commit(root) == "911a490"
    monkeypatch.setenv("REQUANT_COMMIT", "0" * 40 + "-dirty")
    assert git_commit(root) == "0" * 40 + "-dirty"
    for junk in ("HEAD", "main", "911a49", "911a490 ", "911A490"):
        monkeypatch.setenv("REQUANT_COMMIT", junk)
        expect = "911a490" if junk == "911a490 " else head + "-dirty"  # surrounding blanks are trimmed
        assert git_commit(root) == expect, junk
