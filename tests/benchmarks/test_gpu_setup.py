"""benchmarks/gpu_setup.sh on the CPU with a stand-in python3 that logs its arguments: the carried
wheels are installed once per distinct set (a reinstall rewrites the CUTLASS headers and made ninja
rebuild the extension in every GPU call), the checkout's editable install every time. Independent
reference: the stand-in's log, read back here."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "benchmarks" / "gpu_setup.sh"


def _source(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    log.write_text("")
    r = subprocess.run(
        ["bash", "-c", f'source "{SETUP}" || exit 9; echo "PYTHONPATH=$PYTHONPATH"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "CALLS": str(log),
            "REQUANT_WHEELS": str(tmp_path / "wheels"),
            "REQUANT_SITE": str(tmp_path / "site"),
        },
    )
    assert r.returncode == 0, r.stderr
    assert f"PYTHONPATH={tmp_path / 'site'}" in r.stdout
    return log.read_text().splitlines()


def test_the_same_wheels_are_installed_once(tmp_path):
    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin" / "python3"
    stub.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n')
    stub.chmod(0o755)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"first")

    def kinds(calls):
        return ["target" if "--target" in c else "editable" if " -e ." in c else c for c in calls]

    assert kinds(_source(tmp_path)) == ["target", "editable"]  # a fresh machine: both
    assert kinds(_source(tmp_path)) == ["editable"]  # the same wheels on a warm machine: not again
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"changed")
    assert kinds(_source(tmp_path)) == ["target", "editable"]  # other bytes: installed again
    (tmp_path / "wheels" / "b-1-py3-none-any.whl").write_bytes(b"more")
    assert kinds(_source(tmp_path)) == ["target", "editable"]  # another wheel: installed again
    assert kinds(_source(tmp_path)) == ["editable"]
    os.remove(tmp_path / "site" / ".requant-wheels")  # a site without the stamp: installed again
    assert kinds(_source(tmp_path)) == ["target", "editable"]
