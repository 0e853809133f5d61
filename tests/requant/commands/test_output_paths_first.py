"""Every output path (--json, --report, --plot, -o) is checked before any work: a path that
cannot be written is exit 2 with one line naming the option, and nothing was computed or
written. Reference: the directory listing before and after, and a stand-in for the first step
of the work (opening the checkpoint) that fails the test if it is reached."""

import pytest
from typer.testing import CliRunner

from requant.cli import app
from tests.requant.commands.cli import open_checkpoint_fails

runner = CliRunner()


@pytest.fixture
def no_work(monkeypatch):
    open_checkpoint_fails(monkeypatch, "the work started before the output paths were checked")


@pytest.fixture
def plainfile(tmp_path):
    p = tmp_path / "plainfile"
    p.write_text("a file, not a directory")
    return p


def _refused(res, option, tmp_path, before):
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and option in errors[0] and "Traceback" not in res.output, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


CASES = [
    (["audit", "--backends", "reference", "--prompts", "1", "--json", "{f}/a.json"], "--json"),
    (["audit", "--backends", "reference", "--prompts", "1", "--report", "{f}"], "--report"),
    (["audit", "--backends", "reference", "--prompts", "1", "--report", "{f}/sub"], "--report"),
    (["determinism", "--backends", "reference", "--prompts", "1", "--json", "{f}/d.json"], "--json"),
    (["eval", "--arms", "native", "--limit", "1", "--json", "{f}/e.json"], "--json"),
    (["eval", "--arms", "native", "--limit", "1", "--report", "{f}"], "--report"),
    (["convert", "-o", "{t}/out", "--json", "{f}/c.json"], "--json"),
    (["convert", "-o", "{t}/out", "--plot", "{t}"], "--plot"),
    (["convert", "-o", "{f}/out"], "-o"),
]


@pytest.mark.parametrize(
    "args,option", CASES, ids=[f"{a[0]}{a[-2] if a[-2].startswith('-') else ''}-{i}" for i, (a, _) in enumerate(CASES)]
)
def test_an_unwritable_output_path_is_refused_before_any_work(tmp_path, plainfile, no_work, args, option):
    before = sorted(p.name for p in tmp_path.iterdir())
    res = runner.invoke(app, [a.format(f=plainfile, t=tmp_path) for a in args])
    _refused(res, option, tmp_path, before)


def test_a_json_path_that_is_a_directory_is_refused(tmp_path, no_work):
    (tmp_path / "d").mkdir()
    res = runner.invoke(app, ["determinism", "--backends", "reference", "--json", str(tmp_path / "d")])
    _refused(res, "--json", tmp_path, ["d"])
    assert "is a directory" in res.stderr


def test_a_missing_parent_directory_of_a_report_is_refused_not_created(tmp_path, no_work):
    # requant makes no directory the user did not name: the error names the missing one
    out = tmp_path / "a" / "b" / "c.json"
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "out"), "--json", str(out)])
    _refused(res, "--json", tmp_path, [])
    assert f"the directory {tmp_path / 'a' / 'b'} does not exist" in res.stderr


def test_convert_output_directory_parents_are_made(tmp_path):
    # -o (a checkpoint, made atomically) keeps making its missing parents, as the Quickstart's
    # `convert -o out/pow2` needs in a fresh directory (reference: the directory appears)
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "a" / "pow2"), "-q"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a" / "pow2" / "config.json").is_file()
