"""The import paths of modules that moved when the package was grouped by concern still work
(requant/_aliases.py): the old name is the new module itself, not a copy, so a monkeypatch through
either name is seen by both; `python -m requant.synthetic` still runs the generator."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from requant._aliases import MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module(old):
    new = MOVED[old]
    assert importlib.import_module(old) is importlib.import_module(new)
    # the old file is gone: the name resolves through the finder, not through a stale copy
    rel = old.split(".", 1)[1].replace(".", "/")
    top = "audit" if rel.startswith("audit/") else "requant"
    rel = rel.removeprefix("audit/")
    assert not (ROOT / top / f"{rel}.py").exists()


def test_unknown_names_still_fail():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("requant.no_such_module")


def test_monkeypatch_through_old_name(monkeypatch):
    import requant.io.output as new

    old = importlib.import_module("requant.output")
    monkeypatch.setattr(old, "fsync_path", "patched")
    assert new.fsync_path == "patched"


def test_python_m_old_synthetic_path(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "requant.synthetic", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout and "--seed" in res.stdout
