"""The exit-code policy of requant/commands/_common.py, command by command: 0 done or the
check passed, 1 it ran and the check failed, 2 it could not run (one `error:` line on
stderr, no traceback). Reference: the policy as documented, and inputs built here whose
verdict is known independently (a missing directory, bytes changed after hashing)."""

import shutil

import pytest
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app

runner = CliRunner()


def _invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res


def _one_error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


MISSING = "/nonexistent/requant-checkpoint"

CANNOT_RUN = {
    "convert": ["convert", MISSING, "-o", "{tmp}/out"],
    "inspect": ["inspect", MISSING],
    "verify": ["verify", MISSING, str(DEFAULT_CHECKPOINT)],
    "audit": ["audit", MISSING, "--backends", "reference"],
    "determinism": ["determinism", MISSING, "--backends", "reference"],
    "eval": ["eval", MISSING, "--backend", "reference-triton-order"],
    "manifest": ["manifest", MISSING],
    "card": ["card", MISSING],
    "push": ["push", MISSING, "someone/model", "--dry-run"],
    "tp-check": ["tp-check", MISSING],
    "generate": ["generate", MISSING, "--prompt", "x"],
    "replay": ["replay", MISSING],
    "conform": ["conform", "--kernel", "nonexistent_requant_module:scaled_mm"],
}


@pytest.mark.parametrize("command", sorted(CANNOT_RUN))
def test_missing_checkpoint_exits_2_with_one_line(command, tmp_path):
    res = _invoke(*[a.format(tmp=tmp_path) for a in CANNOT_RUN[command]])
    assert res.exit_code == 2, (command, res.output)
    assert "nonexistent" in _one_error_line(res)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["audit", "determinism", "eval", "tp-check", "generate"])
def test_bad_device_exits_2_naming_the_option(command):
    res = _invoke(command, "--device", "banana")
    assert res.exit_code == 2 and "--device" in _one_error_line(res)


def test_verify_difference_exits_1_and_identical_exits_0(tmp_path):
    a = tmp_path / "a"
    shutil.copytree(DEFAULT_CHECKPOINT, a)
    assert _invoke("verify", a, DEFAULT_CHECKPOINT).exit_code == 0
    cfg = a / "config.json"
    cfg.write_bytes(cfg.read_bytes() + b" ")
    res = _invoke("verify", a, DEFAULT_CHECKPOINT)
    assert res.exit_code == 1 and "config.json" in res.output


def test_manifest_mismatch_exits_1_and_match_exits_0(tmp_path):
    a = tmp_path / "a"
    shutil.copytree(DEFAULT_CHECKPOINT, a)
    assert _invoke("manifest", a, "--write").exit_code == 0
    assert _invoke("manifest", a).exit_code == 0
    cfg = a / "config.json"
    cfg.write_bytes(cfg.read_bytes() + b" ")
    res = _invoke("manifest", a)
    assert res.exit_code == 1 and "config.json" in res.output


def test_version():
    from requant import __version__

    res = _invoke("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"requant {__version__}"


@pytest.mark.parametrize("command", ["determinism", "eval"])
@pytest.mark.parametrize(
    "engine,what", [("turbo", "--engine must be one of"), ("fast", "--engine fast needs a CUDA GPU")]
)
def test_bad_engine_exits_2_naming_the_option(command, engine, what, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = _invoke(command, "--device", "cpu", "--engine", engine)
    assert res.exit_code == 2 and what in _one_error_line(res)
