"""benchmarks/commit_id.sh: the commit a GPU run records in env.txt. Reference: git itself
(rev-parse HEAD and status --porcelain) on a repository made here, and the environment
variable for a copy without .git (the GPU machine's case). Never the word HEAD."""

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "commit_id.sh"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]


def _tree(root: Path) -> Path:
    """A copy of the script where a working tree would have it: root/benchmarks/."""
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "benchmarks" / "commit_id.sh")
    return root


def _run(root: Path, *args: str, **env) -> str:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k != "REQUANT_COMMIT"}
    e.update(env)
    out = subprocess.run(
        ["bash", str(root / "benchmarks" / "commit_id.sh"), *args],
        cwd="/",
        env=e,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_copy_without_git(tmp_path):
    root = _tree(tmp_path / "copy")
    assert _run(root) == "unknown"
    assert _run(root, REQUANT_COMMIT="0123abc-dirty") == "0123abc-dirty"


def test_git_checkout_clean_and_dirty(tmp_path):
    root = _tree(tmp_path / "repo")
    subprocess.run(GIT + ["init", "-q"], cwd=root, check=True)
    subprocess.run(GIT + ["add", "-A"], cwd=root, check=True)
    subprocess.run(GIT + ["commit", "-q", "-m", "x"], cwd=root, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert len(head) == 40
    assert _run(root, REQUANT_COMMIT="ignored: not a commit id") == head
    # a declared commit wins over git (the GPU machine's copy can carry a stale .git)
    assert _run(root, REQUANT_COMMIT="0123abc") == "0123abc"
    assert _run(root, REQUANT_COMMIT="HEAD") == head
    (root / "new.txt").write_text("untracked")
    assert _run(root) == head + "-dirty"


def test_a_repository_around_the_copy_is_not_ours(tmp_path):
    """A copy inside some other git repository: that repository's HEAD is not the commit
    of the copy, so the environment variable (or unknown) is used."""
    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(GIT + ["init", "-q"], cwd=outer, check=True)
    (outer / "f").write_text("x")
    subprocess.run(GIT + ["add", "-A"], cwd=outer, check=True)
    subprocess.run(GIT + ["commit", "-q", "-m", "x"], cwd=outer, check=True)
    root = _tree(outer / "copy")
    assert _run(root) == "unknown"
    assert _run(root, REQUANT_COMMIT="0123abc") == "0123abc"
    assert _run(root, REQUANT_COMMIT="abc") == "unknown"  # too short to be a commit id


def test_tree_id_names_the_content_with_or_without_git(tmp_path):
    """--tree: git's own tree id of the committed content (rev-parse HEAD^{tree}) on a clean
    checkout; the same in a copy without .git and in one whose .git is stale; ignored files do not
    count; an untracked or changed file gives another id."""
    root = _tree(tmp_path / "repo")
    (root / "a.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("/.whl/\n__pycache__/\n")
    subprocess.run(GIT + ["init", "-q"], cwd=root, check=True)
    subprocess.run(GIT + ["add", "-A"], cwd=root, check=True)
    subprocess.run(GIT + ["commit", "-q", "-m", "x"], cwd=root, check=True)
    want = subprocess.run(
        ["git", "rev-parse", "HEAD^{tree}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert _run(root, "--tree") == want
    (root / ".whl").mkdir()
    (root / ".whl" / "w.whl").write_text("ignored")
    assert _run(root, "--tree") == want
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git"))
    assert _run(copy, "--tree") == want  # no .git at all
    (root / "a.py").write_text("x = 2\n")
    subprocess.run(GIT + ["commit", "-q", "-am", "y"], cwd=root, check=True)
    shutil.copytree(root / ".git", copy / ".git")  # a .git from another commit beside the copy
    assert (
        _run(copy)
        == subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        + "-dirty"
    )
    assert _run(copy, "--tree") == want  # the tree still names the copy's content
    (copy / "new.txt").write_text("untracked")
    assert _run(copy, "--tree") not in (want, "unknown")


def test_gpu_scripts_record_it():
    """The GPU scripts' environment record (gpu_env in the helper they all source) names the
    commit through this script, never through git rev-parse HEAD."""
    helper = (SCRIPT.parent / "_gpu_common.sh").read_text()
    assert (
        'echo "commit $(bash benchmarks/commit_id.sh)"' in helper
        and 'echo "tree $(bash benchmarks/commit_id.sh --tree)"' in helper
        and "REQUANT_COMMIT=$(bash benchmarks/commit_id.sh)" in helper
    )
    for path in SCRIPT.parent.glob("gpu_*.sh"):
        text = path.read_text()
        assert "rev-parse HEAD" not in text, path.name
        if path.name != "gpu_setup.sh":
            assert "_gpu_common.sh" in text and "gpu_env" in text, path.name
