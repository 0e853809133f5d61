"""`python -m requant.checkpoint.synthetic PRESET DIR` never mixes a random model into existing files: a
non-empty DIR is refused without --force, and --force replaces a checkpoint as a whole (no stale
tokenizer kept) but never a directory of other things. References: the files on disk before and
after (tree_bytes), and generate() into a fresh directory."""

import shutil
import subprocess
import sys

import pytest

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint.synthetic import generate, main
from requant.errors import OutputError
from tests.requant.conftest import MICRO, leftovers, tree_bytes


def test_the_readme_command_cannot_overwrite_the_default(tmp_path):
    d = tmp_path / "default"
    shutil.copytree(DEFAULT_CHECKPOINT, d)
    before = tree_bytes(d)
    res = subprocess.run(
        [sys.executable, "-m", "requant.checkpoint.synthetic", "tiny", str(d)], capture_output=True, text=True
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "--force" in res.stderr
    assert "Traceback" not in res.stderr and tree_bytes(d) == before


def test_force_replaces_a_checkpoint_as_a_whole(tmp_path):
    d = tmp_path / "default"
    shutil.copytree(DEFAULT_CHECKPOINT, d)
    assert main(["tiny", str(d), "--force"]) == 0
    ref = generate("tiny", tmp_path / "fresh")
    assert tree_bytes(d) == tree_bytes(ref)  # no tokenizer.json, README or generation config left behind
    assert leftovers(tmp_path, "default") == ["default"]


def test_force_never_replaces_a_directory_of_other_things(tmp_path, capsys):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "x").write_text("mine")
    with pytest.raises(OutputError, match="is not a checkpoint"):
        generate(MICRO, d, force=True)
    assert main(["tiny", str(d), "--force"]) == 2 and "is not a checkpoint" in capsys.readouterr().err
    assert tree_bytes(d) == {"sub/x": b"mine"} and leftovers(tmp_path, "mine") == ["mine"]


def test_an_empty_directory_is_filled(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    generate(MICRO, d, seed=1)
    assert tree_bytes(d) == tree_bytes(generate(MICRO, tmp_path / "fresh", seed=1))


def test_keep_source_is_checked_too(tmp_path):
    src = tmp_path / "bf16"
    src.mkdir()
    (src / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty"):
        generate(MICRO, tmp_path / "q", keep_source=src)
    assert leftovers(tmp_path, "q") == [] and tree_bytes(src) == {"notes.txt": b"mine"}
