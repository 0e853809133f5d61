"""requant.io.leftovers: a run SIGKILLed at the creation of each of its temporaries leaves nothing
that blocks the next run; the next run sweeps it (the writer's pid is dead) and says so, and the
manifest never counts or records it. Deterministic: the killed process kills itself right after
the temporary exists (a patched function in a real `requant` process), no timing race."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from requant.evidence import manifest as mf
from requant.io import leftovers
from tests.requant.commands.cli import invoke

# Run `requant ARGS` in a child that SIGKILLs itself right after `module.attr` returned (the temporary made).
KILLER = textwrap.dedent(
    """
    import importlib, os, signal, sys
    parts = sys.argv[1].split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest importable prefix, then attributes
        try:
            m = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            pass
    for name in parts[i:-1]:
        m = getattr(m, name)
    attr = parts[-1]
    real = getattr(m, attr)
    def killed(*a, **k):
        real(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(m, attr, killed)
    from requant.cli import app
    sys.argv = ["requant", *sys.argv[2:]]
    app()
    """
)


def _killed_at(where: str, *args) -> None:
    res = subprocess.run([sys.executable, "-c", KILLER, where, *map(str, args)], capture_output=True, text=True)
    assert res.returncode == -signal.SIGKILL, res.stderr


def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


def _warnings(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]


def test_killed_manifest_write_leaves_a_temp_the_next_run_sweeps(micro, tmp_path):
    _killed_at("requant.io.output.temp_beside", "manifest", micro, "--write")
    (temp,) = [p for p in micro.iterdir() if p.name.startswith(".SHA256SUMS.requant-tmp-")]
    assert leftovers.is_temp(temp.name) and leftovers.dead_temp(temp.name)
    res = invoke("manifest", micro, "--write")
    assert res.exit_code == 0, res.output
    assert not temp.exists()
    (note,) = _warnings(res)
    assert f"removed {temp}" in note and "left by a run that was killed (pid " in note
    listed, _ = mf.read(micro)
    assert not any("requant-tmp" in rel for rel in listed)  # the hint never records a temp
    assert invoke("manifest", micro).exit_code == 0


def test_killed_report_write_inside_a_checkpoint_does_not_block_its_check(micro, tmp_path):
    assert invoke("manifest", micro, "--write").exit_code == 0
    _killed_at("requant.io.output.temp_beside", "manifest", micro, "--write")  # the rewrite killed
    temps = [p for p in micro.iterdir() if leftovers.is_temp(p.name)]
    assert len(temps) == 1
    res = invoke("manifest", micro)  # a check, not a write: it sweeps too, and passes
    assert res.exit_code == 0, res.output
    assert not temps[0].exists() and len(_warnings(res)) == 1


def test_killed_lock_creation_is_swept_by_the_next_convert(micro, tmp_path):
    out = tmp_path / "out"
    _killed_at("fcntl.flock", "convert", micro, "-o", out, "--arm", "nearest")
    staged = [p for p in tmp_path.iterdir() if p.name.startswith(".out.requant-tmp-")]
    assert [p.name.rpartition(".")[0].endswith(".lock") for p in staged] == [True]
    res = invoke("convert", micro, "-o", out, "--arm", "nearest")
    assert res.exit_code == 0, res.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert any(f"removed {staged[0]}" in w and "a lock left by a run that was killed" in w for w in _warnings(res))


def test_a_live_writers_temp_is_left_alone_and_never_counted(micro):
    live = micro / f".requant-audit.json.requant-tmp-{os.getpid()}-abc.json.tmp"
    live.write_bytes(b"{}")
    assert "requant-tmp" not in " ".join(mf.covered_files(micro))
    assert live.exists()


def test_dead_eval_folders_are_swept_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    dead = tmp_path / f"requant-eval-{_dead_pid()}-x1"
    (dead / "nearest").mkdir(parents=True)
    (dead / "nearest" / "model.safetensors").write_bytes(b"0" * 100)
    live = tmp_path / f"requant-eval-{os.getpid()}-x2"
    live.mkdir()
    notes = []
    monkeypatch.setattr(leftovers, "note", notes.append)
    new = leftovers.eval_dir()
    assert not dead.exists() and live.exists() and new.name.startswith(f"requant-eval-{os.getpid()}-")
    assert notes == [f"removed {dead}: 100 bytes left by an eval that was killed (pid {dead.name.split('-')[2]})"]


@pytest.mark.parametrize(
    "name,temp",
    [
        (".requant-audit.json.requant-tmp-12-abc.json.tmp", True),
        (".README.md.requant-old-3-0123456789ab", True),
        (".requant-audit.json.k2j3h4.tmp", False),  # an older requant's: no pid, counted as before
        ("requant-tmp-12-x", False),
    ],
)
def test_temp_names(name, temp):
    assert leftovers.is_temp(name) is temp


@pytest.mark.parametrize("where", ["requant.io.output._take_lock", "requant.io.output.AtomicOutput.__enter__"])
def test_killed_at_the_output_directory_creation_is_swept_by_the_next_convert(micro, tmp_path, where):
    out = tmp_path / "out"
    _killed_at(where, "convert", micro, "-o", out, "--arm", "nearest")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out."))
    assert left and all(n.startswith(".out.requant-tmp-") for n in left)
    res = invoke("convert", micro, "-o", out, "--arm", "nearest")
    assert res.exit_code == 0, res.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
