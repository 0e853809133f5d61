"""What `pip install requant` puts into site-packages: the one name `requant`, nothing else.

The repository keeps kernels/, audit/ and model_cards/ at its top level; pyproject.toml maps
them to requant.kernels, requant.audit and requant.model_cards. A top-level `kernels` would shadow Hugging
Face's kernels package (transformers imports it), and `audit`/`cli` are names other packages
use. Independent evidence: the wheel setuptools really builds from a copy of this checkout
(its file list), that wheel installed into a fresh directory and imported from outside the
checkout, and the project's own installed environment probed from outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_IGNORE = shutil.ignore_patterns(
    ".git",
    ".whl",
    ".venv",
    "out",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "tests",
    "benchmarks",
)


def _probe(code: str, cwd: Path, pythonpath: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "requant"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_IGNORE)
    dist = tmp_path_factory.mktemp("dist")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    (whl,) = dist.glob("requant-*.whl")
    return whl


def test_wheel_holds_only_the_requant_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"requant", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    # The sibling folders really are inside, under their new names, with their data files.
    for must in (
        "requant/cli.py",
        "requant/kernels/__init__.py",
        "requant/kernels/triton/scaled_mm.py",
        "requant/kernels/cutlass/w8a8_sm90.cu",
        "requant/audit/prediction_matrix.json",
        "requant/data/default/config.json",
        "requant/model_cards/requant_w8a8.md.j2",
        "requant/publish/card.py",
    ):
        assert must in names, must
    assert zipfile.ZipFile(wheel).read("requant/cli.py") == (ROOT / "requant" / "cli.py").read_bytes()
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "requant = requant.cli:app" in entry


def test_wheel_holds_every_source_module(wheel):
    """Every .py of requant/, kernels/ and audit/ reaches the wheel under its installed name (a new
    sub-package missing from pyproject's explicit package list would be silently left out)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    where = {
        "requant": "requant",
        "kernels": "requant/kernels",
        "audit": "requant/audit",
        "model_cards": "requant/model_cards",
    }
    for folder, installed in where.items():
        for f in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in f.parts:
                continue
            rel = f.relative_to(ROOT / folder).as_posix()
            assert f"{installed}/{rel}" in names, (
                f"{folder}/{rel} is not in the wheel: add its package to pyproject.toml"
            )


def test_installed_wheel_imports_under_requant_only(wheel, tmp_path):
    site = tmp_path / "site"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    # requant itself, and the console script's bin/ (pip --target puts scripts there)
    assert {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} == {"requant", "bin"}
    out = _probe(
        "import importlib.util as u, torch\n"
        "import requant, requant.kernels as k, requant.audit.matrix as m, requant.cli as c\n"
        "print(requant.__file__); print(k.__file__); print(c.app.info.name)\n"
        "y = k.scaled_mm(torch.ones(1, 4, dtype=torch.int8), torch.ones(2, 4, dtype=torch.int8), torch.ones(1, 1), torch.ones(2, 1))\n"
        "print(y.tolist()); print(m.load_matrix().sha256 == m.PINNED_SHA256)\n"
        "import requant.model_cards as mc; print(mc.template_path().is_file() and mc.template_path().is_relative_to(requant.__path__[0]))\n"
        "for n in ('kernels', 'audit', 'cli'):\n"
        "    s = u.find_spec(n); print(n, None if s is None else s.origin)\n",
        cwd=tmp_path,
        pythonpath=str(site),
    )
    lines = out.splitlines()
    assert lines[0].startswith(str(site)) and lines[1].startswith(str(site / "requant" / "kernels"))
    assert lines[2] == "requant"
    assert lines[3] == "[[4.0, 4.0]]" and lines[4] == "True"
    assert lines[5] == "True"  # the card template is package data inside the installed requant
    for line in lines[6:]:
        name, origin = line.split(" ", 1)
        assert origin == "None" or not origin.startswith((str(site), str(ROOT))), line


def test_project_environment_has_no_top_level_kernels(tmp_path):
    """The environment the tests run in (an editable or a normal install), probed from a
    directory outside the checkout: `import kernels` must not find this repository's."""
    out = _probe(
        "import importlib.util as u\nfor n in ('kernels', 'audit', 'cli'):\n    s = u.find_spec(n); print(n, None if s is None else s.origin)\n"
        "import requant.kernels; print('requant.kernels', requant.kernels.__file__)\n",
        cwd=tmp_path,
    )
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    for n in ("kernels", "audit", "cli"):
        assert lines[n] == "None" or not lines[n].startswith(str(ROOT)), (n, lines[n])
    origin = Path(lines["requant.kernels"])
    # this checkout's kernels/ (editable install), or requant/kernels/ of an installed wheel
    assert origin.parts[-2:] == ("kernels", "__init__.py")
