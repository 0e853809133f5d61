"""The CUTLASS build's staged sources (kernels/cutlass stage_sources): ninja rebuilds by mtime, so a
fresh copy of the checkout must not make the cached extension look stale. Reference: the files'
bytes and mtimes, read back with os.stat (no GPU, no compiler)."""

import os
import shutil

from requant.kernels import cutlass

OLD = 1_000_000_000  # an mtime long before any copy made here


def _checkout(tmp_path):
    here = tmp_path / "checkout"
    here.mkdir()
    for name in cutlass.SOURCES + cutlass.HEADERS:
        shutil.copyfile(os.path.join(cutlass._HERE, name), here / name)
    return here


def test_staged_copies_keep_their_mtime_until_their_bytes_change(tmp_path, monkeypatch):
    here = _checkout(tmp_path)
    monkeypatch.setattr(cutlass, "_HERE", str(here))
    src = cutlass.stage_sources(str(tmp_path / "cache"))
    names = cutlass.SOURCES + cutlass.HEADERS
    for name in names:
        assert (here / name).read_bytes() == open(os.path.join(src, name), "rb").read(), name
        os.utime(os.path.join(src, name), (OLD, OLD))
    # a fresh copy of the same checkout: every file rewritten, new mtimes, the same bytes
    for name in names:
        (here / name).write_bytes((here / name).read_bytes())
    assert cutlass.stage_sources(str(tmp_path / "cache")) == src
    assert {n: os.stat(os.path.join(src, n)).st_mtime for n in names} == dict.fromkeys(names, OLD)
    # one header edited: only its copy is rewritten
    changed = cutlass.HEADERS[-1]
    (here / changed).write_bytes((here / changed).read_bytes() + b"\n// edited\n")
    cutlass.stage_sources(str(tmp_path / "cache"))
    assert open(os.path.join(src, changed), "rb").read().endswith(b"// edited\n")
    assert os.stat(os.path.join(src, changed)).st_mtime != OLD
    assert all(os.stat(os.path.join(src, n)).st_mtime == OLD for n in names if n != changed)
    assert sorted(os.listdir(src)) == sorted(names)  # no temporary file left behind


def test_the_build_compiles_the_staged_copies(tmp_path, monkeypatch):
    monkeypatch.setenv("REQUANT_CUTLASS_CACHE", str(tmp_path / "cache"))
    kw = cutlass.load_kwargs()
    src = str(tmp_path / "cache" / "src")
    assert kw["build_directory"] == str(tmp_path / "cache")
    assert kw["sources"] == [os.path.join(src, s) for s in cutlass.SOURCES]
    assert src in kw["extra_include_paths"] and cutlass._HERE not in kw["extra_include_paths"]
    for s in cutlass.SOURCES:
        assert open(os.path.join(src, s), "rb").read() == open(os.path.join(cutlass._HERE, s), "rb").read()
