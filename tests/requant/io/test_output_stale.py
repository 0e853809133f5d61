"""What a killed conversion leaves beside OUT is removed by the next one when its writer is dead,
left alone while its writer lives, and named when it cannot be told; an interrupt after the
rename says that the output is complete. References: the directory listing beside OUT, a real
process killed with SIGKILL (the kernel drops its flock), and a conversion into a fresh
directory for the output's bytes."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import requant.io.output
from requant.convert import convert
from requant.io.output import OutputInterrupted
from tests.requant.conftest import leftovers, tree_bytes

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from requant.io.output import AtomicOutput
    with AtomicOutput(Path(sys.argv[1]), False) as dest:
        (dest.tmp / "model-00001-of-00002.safetensors").write_bytes(b"x" * 100000)
        print(dest.tmp, flush=True)
        time.sleep(60)
""")


def _start_writer(out):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    tmp = proc.stdout.readline().strip()
    assert tmp, "the writer did not start"
    return proc, tmp


def test_a_killed_runs_leftovers_are_removed_by_the_next_run(tmp_path, micro):
    out = tmp_path / "out"
    proc, tmp = _start_writer(out)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.isdir(tmp) and len(leftovers(tmp_path, "out")) == 2  # the directory and its lock
    notes = []
    convert(micro, out, "nearest", on_note=notes.append)
    assert leftovers(tmp_path, "out") == ["out"]
    assert len(notes) == 1 and notes[0].startswith(f"removed {tmp}: 100,000 bytes left by a run that was killed")
    assert f"pid {proc.pid}" in notes[0]


def test_a_live_runs_directory_is_left_alone(tmp_path, micro):
    out = tmp_path / "out"
    proc, tmp = _start_writer(out)
    try:
        notes = []
        convert(micro, tmp_path / "out", "nearest", force=True, on_note=notes.append)
        assert os.path.isdir(tmp) and os.path.getsize(os.path.join(tmp, "model-00001-of-00002.safetensors")) == 100000
        assert len(notes) == 1 and "still writing" in notes[0] and f"pid {proc.pid}" in notes[0]
    finally:
        proc.kill()
        proc.wait()


def test_a_leftover_that_cannot_be_told_is_named_not_removed(tmp_path, micro):
    stray = tmp_path / ".out.requant-tmp-0123456789ab"  # as an older requant left them: no lock
    stray.mkdir()
    (stray / "config.json").write_text("{}")
    aside = tmp_path / ".out.requant-old-0123456789ab"
    aside.mkdir()
    with pytest.warns(RuntimeWarning) as caught:  # the library's default: a warning each
        convert(micro, tmp_path / "out", "nearest")
    assert sorted(str(w.message).split(":")[0] for w in caught) == sorted([str(aside), str(stray)])
    notes = []
    convert(micro, tmp_path / "out", "nearest", force=True, on_note=notes.append)
    assert stray.is_dir() and aside.is_dir() and len(notes) == 2
    assert any("moved aside" in n for n in notes) and any("no lock" in n for n in notes)


@pytest.mark.parametrize("force", [False, True])
def test_an_interrupt_after_the_rename_says_the_output_is_complete(tmp_path, monkeypatch, micro, force):
    ref = convert(micro, tmp_path / "ref", "nearest").output
    out = tmp_path / "out"
    if force:
        convert(micro, out, "ceiling")
    real = requant.io.output.fsync_path

    def interrupted(path):
        if path == out.parent and out.is_dir() and (out / "SHA256SUMS").exists():  # after the rename
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(requant.io.output, "fsync_path", interrupted)
    with pytest.raises(OutputInterrupted, match="written completely") as exc:
        convert(micro, out, "nearest", force=force)
    assert isinstance(exc.value, KeyboardInterrupt) and "\n" not in str(exc.value)
    assert tree_bytes(out) == tree_bytes(ref) and leftovers(tmp_path, "out") == ["out"]


def test_the_command_says_which_interrupt_happened(tmp_path, monkeypatch, micro):
    from typer.testing import CliRunner

    from requant.cli import app

    out = tmp_path / "out"
    real = requant.io.output.fsync_path

    def interrupted(path):
        if path == out.parent and out.is_dir():  # after the rename
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(requant.io.output, "fsync_path", interrupted)
    res = CliRunner().invoke(app, ["convert", str(micro), "-o", str(out)])
    assert res.exit_code == 130, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "written completely" in errors[0] and "nothing was written" not in res.stderr
    assert (out / "SHA256SUMS").is_file() and leftovers(tmp_path, "out") == ["out"]
    monkeypatch.setattr(requant.io.output, "fsync_path", real)
    (tmp_path / ".out2.requant-tmp-0123456789ab").mkdir()  # a leftover that cannot be told: named, as a warning
    res = CliRunner().invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out2")])
    assert res.exit_code == 0 and "warning:" in res.stderr and "no lock" in res.stderr, res.output
