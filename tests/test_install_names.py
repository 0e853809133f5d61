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
        "requant/audit/catalogue/prediction_matrix.json",
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
        "import requant, requant.kernels as k, requant.audit.catalogue.matrix as m, requant.cli as c\n"
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


# The clone's top-level names that install under requant (pyproject's package-dir) and so must never
# hide a distribution of the same name when Python runs from the clone's root. tests/, benchmarks/
# and training/ are the clone's own development packages, run only from the clone (pytest inserts
# the root for tests/): they are not listed, and test_no_installed_distribution_is_hidden says so.
HANDED_OVER = ("kernels", "audit", "model_cards", "cli")
DEV_ONLY = ("tests", "benchmarks", "training")


def _clone_top_level() -> set[str]:
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return names | {p.stem for p in ROOT.glob("*.py")}


def test_the_handed_over_names_are_every_top_level_name_but_requant_and_dev_packages():
    assert _clone_top_level() == {*HANDED_OVER, *DEV_ONLY, "requant"}


def test_from_the_clone_root_each_name_is_the_installed_distribution(tmp_path):
    """A stand-in distribution for every top-level name of the clone, on PYTHONPATH (as site-packages
    is, after the current directory): run from the clone's root, each import gets the stand-in, its
    submodules and attributes included (the reference: the stand-in's own marker)."""
    site = tmp_path / "site"
    for name in HANDED_OVER:
        if name == "cli":
            (site / "cli.py").parent.mkdir(parents=True, exist_ok=True)
            (site / "cli.py").write_text("MARK = 'installed cli'\n")
        else:
            (site / name).mkdir(parents=True)
            (site / name / "__init__.py").write_text(f"MARK = 'installed {name}'\n")
            (site / name / "sub.py").write_text(f"MARK = 'installed {name}.sub'\n")
    code = "import importlib\n"
    for name in HANDED_OVER:
        code += f"m = importlib.import_module({name!r}); print(m.MARK, m.__file__)\n"
        if name != "cli":
            code += f"s = importlib.import_module({name + '.sub'!r}); print(s.MARK)\n"
    code += "import requant.kernels as k, requant.audit.catalogue.matrix, requant.model_cards as mc; print(k.__file__, mc.__file__)\n"
    lines = _probe(code, cwd=ROOT, pythonpath=str(site)).splitlines()
    want = []
    for name in HANDED_OVER:
        origin = site / ("cli.py" if name == "cli" else f"{name}/__init__.py")
        want.append(f"installed {name} {origin}")
        if name != "cli":
            want.append(f"installed {name}.sub")
    want.append(f"{ROOT / 'kernels' / '__init__.py'} {ROOT / 'model_cards' / '__init__.py'}")
    assert lines == want


def test_from_the_clone_root_a_name_not_installed_stays_the_clones(tmp_path):
    """Where no distribution has the name, nothing is hidden and the clone's module stays itself: every
    handed-over name that nothing installed provides (found from outside the clone) is the clone's file."""
    free = [
        n
        for n in HANDED_OVER
        if _probe(f"import importlib.util as u; print(u.find_spec({n!r}))", cwd=tmp_path).strip() == "None"
    ]
    assert free, "every handed-over name is installed here: nothing left to check"
    code = "".join(f"import {n}; print({n}.__file__)\n" for n in free)
    want = [str(ROOT / n / "__init__.py") if n != "cli" else str(ROOT / "cli.py") for n in free]
    assert _probe(code, cwd=ROOT).splitlines() == want


def test_no_installed_distribution_is_hidden_from_the_clone_root(tmp_path):
    """Every top-level name of every installed distribution that the clone also defines resolves,
    from the clone's root, to the distribution's own file (found from outside the clone)."""
    import importlib.metadata

    clashes = sorted(set(importlib.metadata.packages_distributions()) & (_clone_top_level() - {"requant"}))
    assert not set(clashes) & set(DEV_ONLY), (
        f"an installed distribution has a name of the clone's dev packages: {clashes}"
    )
    for name in clashes:
        outside = _probe(f"import importlib.util as u; print(u.find_spec({name!r}).origin)", cwd=tmp_path).strip()
        inside = _probe(f"import {name}; print({name}.__file__)", cwd=ROOT).strip()
        assert inside == outside, name


def test_transformers_imports_from_the_clone_root():
    """The failure a new user met: transformers >= 5.2x imports Hugging Face's `kernels`; from the
    clone's root it must get that package, and the model class the runtime's parity test uses loads."""
    out = _probe(
        "import transformers\nfrom transformers import Qwen3ForCausalLM\nprint(Qwen3ForCausalLM.__name__)", cwd=ROOT
    )
    assert out.strip() == "Qwen3ForCausalLM"


def test_import_requant_cli_from_the_folder_holding_a_clone_says_so_in_one_line(tmp_path):
    """`import requant.cli` where the current directory holds a clone named requant: the clear line
    requant/errors.py gives for every other module, not a circular-import traceback."""
    (tmp_path / "requant").symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for module in ("requant.cli", "requant.convert"):
        res = subprocess.run(
            [sys.executable, "-c", f"import {module}"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert res.returncode == 1
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: `import requant` found the directory ") and "python -P" in last, last
        assert "circular import" not in res.stderr
