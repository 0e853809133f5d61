"""Report targets through the real cli.app: a --json/--report/--plot/--export target that is
not a regular file, or that lies inside the checkpoint, is refused before any work with one
`error:` line naming the option; a set of reports is all or nothing; a failure after a
complete checkpoint says so. References: os.lstat and directory listings before and after,
and a stand-in for the first step of the work that fails the test if it is reached."""

import errno
import os
import stat

import pytest
from typer.testing import CliRunner

import requant.commands.checkpoint as convert_cmd
from requant.cli import app
from tests.requant.commands.cli import open_checkpoint_fails

runner = CliRunner()


@pytest.fixture
def no_work(monkeypatch):
    open_checkpoint_fails(monkeypatch, "the work started before the report targets were checked")


def _one_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:"), res.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def _special(tmp_path, kind):
    p = tmp_path / f"target-{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "stdout-link":
        p.symlink_to("/proc/self/fd/1")
    elif kind == "device":
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root here")
    return p


COMMANDS = {
    "audit": ["audit", "--backends", "reference", "--prompts", "1", "--json"],
    "convert": ["convert", "-o", "{t}/out", "--json"],
    "convert-plot": ["convert", "-o", "{t}/out", "--plot"],
    "eval": ["eval", "--arms", "native", "--limit", "1", "--json"],
    "determinism": ["determinism", "--backends", "reference", "--prompts", "1", "--json"],
}


@pytest.mark.parametrize("kind", ["fifo", "dir", "stdout-link", "device"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_report_target_that_is_not_a_regular_file_is_refused_before_work(tmp_path, no_work, command, kind):
    target = _special(tmp_path, kind)
    before = os.lstat(target)
    args = [a.format(t=tmp_path) for a in COMMANDS[command]] + [str(target)]
    if command == "convert-plot":
        target_png = tmp_path / "p.png"  # the extension check is not what refuses it
        os.rename(target, target_png)
        args[-1] = str(target_png)
        target = target_png
    res = runner.invoke(app, args)
    _one_error(res, COMMANDS[command][-1])
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert not (tmp_path / "out").exists()


def test_conform_json_into_a_fifo_is_refused_before_the_vectors_are_built(tmp_path, monkeypatch):
    import requant.audit.conform.vectors as V

    monkeypatch.setattr(V, "build_vectors", lambda: (_ for _ in ()).throw(AssertionError("work started")))
    fifo = _special(tmp_path, "fifo")
    _one_error(runner.invoke(app, ["conform", "--backend", "reference", "--json", str(fifo)]), "--json", "FIFO")


def test_tp_check_json_is_checked_before_the_launch(tmp_path, monkeypatch):
    import requant.tp

    monkeypatch.setattr(requant.tp, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    d = _special(tmp_path, "dir")
    _one_error(runner.invoke(app, ["tp-check", "--tp", "1,2", "--json", str(d)]), "--json", "directory")


def test_audit_report_dir_with_audit_md_a_directory_is_refused_before_work(tmp_path, no_work):
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "audit.md").mkdir()
    res = runner.invoke(app, ["audit", "--backends", "reference", "--prompts", "1", "--report", str(tmp_path / "rep")])
    _one_error(res, "--report", "audit.md")
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["audit.md"]


def test_conform_export_with_vectors_json_a_directory_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "vec").mkdir()
    (tmp_path / "vec" / "vectors.json").mkdir()
    res = runner.invoke(app, ["conform", "--backend", "reference", "--export", str(tmp_path / "vec")])
    _one_error(res, "--export", "vectors.json")
    assert sorted(p.name for p in (tmp_path / "vec").iterdir()) == ["vectors.json"]


def test_conform_interrupted_before_the_verdict_writes_nothing(tmp_path, monkeypatch):
    import requant.audit.conform as C

    monkeypatch.setattr(C, "run_cases", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    res = runner.invoke(
        app,
        ["conform", "--backend", "reference", "--export", str(tmp_path / "vec"), "--json", str(tmp_path / "c.json")],
    )
    assert res.exit_code == 130 and "nothing was written" in res.stderr
    assert not (tmp_path / "vec").exists() or not any((tmp_path / "vec").iterdir())
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("inside", ["source", "output"])
def test_convert_json_inside_the_source_or_the_output_is_refused_before_work(micro, tmp_path, inside):
    where = micro if inside == "source" else tmp_path / "out"
    before = sorted(p.name for p in micro.iterdir())
    res = runner.invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out"), "--json", str(where / "stats.json")])
    _one_error(res, "--json", f"inside the {inside}")
    assert sorted(p.name for p in micro.iterdir()) == before and not (tmp_path / "out").exists()


def test_convert_plot_with_a_text_extension_is_refused_before_the_conversion(micro, tmp_path):
    res = runner.invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out"), "--plot", str(tmp_path / "plot.txt")])
    _one_error(res, "--plot", ".png")
    assert not (tmp_path / "out").exists()


def test_convert_disk_full_writing_json_says_the_checkpoint_is_complete(micro, tmp_path, monkeypatch):
    real = convert_cmd.write_files_atomic

    def full(items):
        def enospc(tmp):
            tmp.write_bytes(b"{")
            raise OSError(errno.ENOSPC, "No space left on device")

        return real([(dest, enospc) for dest, _ in items])

    monkeypatch.setattr(convert_cmd, "write_files_atomic", full)
    out, js = tmp_path / "out", tmp_path / "stats.json"
    res = runner.invoke(
        app, ["convert", str(micro), "-o", str(out), "--json", str(js), "--plot", str(tmp_path / "p.png")]
    )
    line = _one_error(res, f"the checkpoint at {out} is complete", str(js), "No space left on device")
    assert ".tmp" not in line
    assert (out / "SHA256SUMS").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("micro",)) == ["out"]


def test_convert_json_and_plot_are_published_together(micro, tmp_path):
    js, png = tmp_path / "stats.json", tmp_path / "p.png"
    res = runner.invoke(
        app, ["convert", str(micro), "-o", str(tmp_path / "out"), "-q", "--json", str(js), "--plot", str(png)]
    )
    assert res.exit_code == 0, res.output
    assert js.read_bytes().startswith(b"{") and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_card_with_a_directory_named_readme_refuses_before_writing_sha256sums(micro):
    (micro / "README.md").mkdir()
    res = runner.invoke(app, ["card", str(micro)])
    _one_error(res, "README.md", "directory")
    assert not (micro / "SHA256SUMS").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "1e-300", "-1"])
def test_tp_check_timeout_nan_inf_tiny_is_refused_at_parse_time(value, no_work):
    res = runner.invoke(app, ["tp-check", "--timeout", value])
    assert res.exit_code == 2 and "--timeout" in res.output and "Traceback" not in res.output


def test_tp_check_act_backend_nope_is_refused_at_parse_time_naming_the_option(no_work):
    res = runner.invoke(app, ["tp-check", "--act-backend", "nope"])
    assert res.exit_code == 2 and "--act-backend" in res.output and "rank" not in res.output
