"""`convert --force` replaces only what is recognisably a checkpoint (config.json with
.safetensors weights), an empty directory or a symlink (as a link); anything else is refused
and left as it was. References: the files on disk before and after (tree_bytes), and the
output a conversion into a fresh directory writes."""

import pytest
from typer.testing import CliRunner

from requant.cli import app
from requant.convert import convert
from requant.errors import OutputError
from tests.requant.conftest import leftovers, tree_bytes

runner = CliRunner()


def _unrelated(path):
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    (path / "sub").mkdir()
    (path / "sub" / "x").write_text("also mine")
    return path


def test_force_never_deletes_a_directory_that_is_not_a_checkpoint(tmp_path, micro):
    out = _unrelated(tmp_path / "out")
    before = tree_bytes(out)
    with pytest.raises(OutputError, match="is not a checkpoint"):
        convert(micro, out, "nearest", force=True)
    assert tree_bytes(out) == before and leftovers(tmp_path, "out") == ["out"]
    res = runner.invoke(app, ["convert", str(micro), "-o", str(out), "--force"])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.output
    assert "is not a checkpoint" in res.stderr
    assert tree_bytes(out) == before and leftovers(tmp_path, "out") == ["out"]


def test_force_never_replaces_a_file(tmp_path, micro):
    out = tmp_path / "out"
    out.write_text("a file")
    with pytest.raises(OutputError, match="is not a directory"):
        convert(micro, out, "nearest", force=True)
    assert out.read_text() == "a file"


def test_force_replaces_an_empty_directory_and_a_checkpoint(tmp_path, micro):
    ref = convert(micro, tmp_path / "ref", "nearest").output
    out = tmp_path / "out"
    out.mkdir()
    convert(micro, out, "nearest", force=True)
    assert tree_bytes(out) == tree_bytes(ref)
    convert(micro, out, "nearest", force=True)  # over an earlier conversion: nothing of a user's in it
    assert tree_bytes(out) == tree_bytes(ref)
    (out / "extra.txt").write_text("left by a user in a checkpoint: never deleted silently")
    before = tree_bytes(out)
    with pytest.raises(OutputError, match=r"holds files a conversion did not write \(extra.txt\)"):
        convert(micro, out, "nearest", force=True)
    assert tree_bytes(out) == before


def test_force_checks_again_before_the_rename(tmp_path, micro):
    out = convert(micro, tmp_path / "out", "nearest").output

    def make_it_unrelated(total):  # after the first check, before the rename
        for p in sorted(out.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        (out / "keep.txt").write_text("mine")

    with pytest.raises(OutputError, match="is not a checkpoint"):
        convert(micro, out, "nearest", force=True, on_start=make_it_unrelated)
    assert tree_bytes(out) == {"keep.txt": b"mine"} and leftovers(tmp_path, "out") == ["out"]


def test_force_checks_for_a_users_files_again_before_the_rename(tmp_path, micro):
    # a report written into OUT while the conversion runs is not deleted either (reference: its bytes)
    out = convert(micro, tmp_path / "out", "nearest").output

    def write_a_report(total):  # after the first check, before the rename
        (out / "requant-audit.json").write_text('{"written": "meanwhile"}\n')

    with pytest.raises(OutputError, match=r"holds files a conversion did not write \(requant-audit.json\)"):
        convert(micro, out, "nearest", force=True, on_start=write_a_report)
    assert (out / "requant-audit.json").read_text() == '{"written": "meanwhile"}\n'
    assert leftovers(tmp_path, "out") == ["out"]
