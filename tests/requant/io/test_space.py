"""Every error names the path and the next step: a full filesystem (ENOSPC injected at the writer)
names the file and its filesystem; convert refuses an output that cannot fit before it writes
(needed vs free); --force that cannot remove the old copy says where it is left; a damaged download
in the Hugging Face cache names the cache entry to remove."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from requant.convert import _streaming
from requant.evidence import manifest as mf
from requant.io import output, space
from tests.requant.commands.cli import invoke, refused


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_convert_that_cannot_fit_is_refused_before_writing(micro, tmp_path, monkeypatch):
    monkeypatch.setattr(space, "free_bytes", lambda path: 1000)
    out = tmp_path / "out"
    need = sum(p.stat().st_size for p in micro.iterdir() if p.is_file())
    res = invoke("convert", micro, "-o", out, "--arm", "nearest")
    line = refused(res, str(out), f"needs {need:,} bytes but the filesystem mounted at ", "has 1,000 free")
    assert "choose an output on another filesystem" in line
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_enospc_while_converting_names_the_shard_and_its_filesystem(micro, tmp_path, monkeypatch):
    monkeypatch.setattr(_streaming, "_pwrite_all", _enospc)
    out = tmp_path / "out"
    res = invoke("convert", micro, "-o", out, "--arm", "nearest")
    line = refused(res, str(out / "model.safetensors"), "No space left on device on the filesystem mounted at ")
    assert f"{space.mount_of(tmp_path)} (" in line and "bytes free): free space there" in line
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_enospc_writing_a_report_names_it_and_its_filesystem(micro, monkeypatch):
    monkeypatch.setattr(output, "fsync_path", _enospc)
    res = invoke("manifest", micro, "--write")
    refused(res, str(micro / "SHA256SUMS"), "writing failed: No space left on device on the filesystem mounted at ")
    assert not (micro / "SHA256SUMS").exists() and not [p for p in micro.iterdir() if p.name.startswith(".")]


def test_force_that_cannot_remove_the_old_copy_says_where_it_is_left(micro, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert invoke("convert", micro, "-o", out, "--arm", "nearest").exit_code == 0
    real = output.shutil.rmtree
    monkeypatch.setattr(  # as a read-only tree under root without CAP_DAC_OVERRIDE: nothing removed
        output.shutil, "rmtree", lambda p, *a, **k: None if ".requant-old-" in str(p) else real(p, *a, **k)
    )
    res = invoke("convert", micro, "-o", out, "--arm", "nearest", "--force")
    assert res.exit_code == 0, res.output
    (old,) = [p for p in tmp_path.iterdir() if ".out.requant-old-" in p.name]
    (note,) = [ln for ln in res.stderr.splitlines() if "could not be removed" in ln]
    assert f"what is left of it is at {old}" in note


@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_damaged_download_names_the_cache_entry(micro, tmp_path, damaged):
    repo = tmp_path / "hub" / "models--org--micro"
    snap, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for p in micro.iterdir():
        data = p.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / p.name)
    mf.write(micro)
    (snap / "SHA256SUMS").write_bytes((micro / "SHA256SUMS").read_bytes())
    blob = (snap / damaged).resolve()
    blob.write_bytes(blob.read_bytes() + b" ")
    with pytest.raises(mf.ManifestError) as caught:
        mf.identity(snap)
    assert str(caught.value).endswith(
        f"{damaged} differs; the download in the Hugging Face cache is damaged: remove {blob} and run again "
        "to download it anew"
    )
