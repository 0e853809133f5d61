"""requant.evidence.manifest and `requant manifest`: SHA256SUMS that anyone can check.

Independent references: GNU coreutils `sha256sum -c` / `sha256sum` (the format and the
digest), hashlib.sha256 over whole-file bytes (the per-file hash), and lines written here by
hand (the canonical form)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from requant.cli import app
from requant.evidence import manifest as mf

runner = CliRunner()


def _ckpt(tmp_path):
    d = tmp_path / "ck"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_bytes(b'{"a": 1}\n')
    (d / "model.safetensors").write_bytes(os.urandom(9 << 20) + b"tail")  # > one 8 MB read
    (d / "sub" / "tokenizer.json").write_bytes(b"{}")
    (d / "LICENSE").write_text("some license\n")
    # evidence about the checkpoint: never listed
    for name in ("README.md", ".gitattributes", "requant-audit.json", "requant-eval.json"):
        (d / name).write_text("x")
    (d / ".cache" / "huggingface").mkdir(parents=True)
    (d / ".cache" / "huggingface" / "meta").write_text("x")
    return d


def test_sha256sum_checks_what_requant_writes(tmp_path):
    """Reference: coreutils sha256sum -c passes on the written file, and sha256sum of the
    manifest equals the digest requant reports; per-file hashes equal hashlib over the bytes."""
    d = _ckpt(tmp_path)
    path, digest = mf.write(d)
    text = path.read_text()
    expected = "".join(
        f"{hashlib.sha256((d / rel).read_bytes()).hexdigest()}  {rel}\n"
        for rel in ("LICENSE", "config.json", "model.safetensors", "sub/tokenizer.json")
    )
    assert text == expected
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum binary")
    res = subprocess.run(["sha256sum", "-c", mf.MANIFEST], cwd=d, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.count(": OK") == 4, res.stdout + res.stderr
    res = subprocess.run(["sha256sum", mf.MANIFEST], cwd=d, capture_output=True, text=True, check=True)
    assert digest == "sha256:" + res.stdout.split()[0]


def test_verify_names_the_first_problem(tmp_path):
    """Reference: the problems made here by hand, in file-name order."""
    d = _ckpt(tmp_path)
    mf.write(d)
    assert mf.verify(d).ok
    (d / "sub" / "tokenizer.json").write_bytes(b"{ }")  # differs
    (d / "extra.bin").write_bytes(b"1")  # not listed
    (d / "LICENSE").unlink()  # missing
    check = mf.verify(d)
    assert not check.ok
    assert (check.missing, check.extra, check.differing) == (["LICENSE"], ["extra.bin"], ["sub/tokenizer.json"])
    assert check.first_problem == "LICENSE missing"
    assert "LICENSE missing" in check.describe() and "2 more problems" in check.describe()
    # evidence files change freely without touching the manifest
    (d / "LICENSE").write_text("some license\n")
    (d / "extra.bin").unlink()
    (d / "sub" / "tokenizer.json").write_bytes(b"{}")
    (d / "README.md").write_text("a new card")
    (d / "requant-audit.json").write_text("{}")
    assert mf.verify(d).ok


@pytest.mark.parametrize(
    "bad",
    [
        b"B" * 64 + b"  config.json\n",  # uppercase hex
        b"a" * 64 + b" config.json\n",  # one space
        b"a" * 64 + b"  config.json\r\n",  # CRLF
        b"a" * 64 + b"  config.json",  # no final newline
        b"b" * 64 + b"  z.json\n" + b"a" * 64 + b"  a.json\n",  # unsorted
        b"a" * 64 + b"  a.json\n" + b"a" * 64 + b"  a.json\n",  # duplicate
        b"a" * 64 + b"  ../a.json\n",  # not a plain relative path
        b"a" * 63 + b"  a.json\n",  # short hash
    ],
)
def test_parse_refuses_non_canonical(bad):
    with pytest.raises(mf.ManifestError):
        mf.parse(bad)


def test_name_that_sha256sum_cannot_hold_plainly_is_refused(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "a\\b").write_text("x")
    with pytest.raises(mf.ManifestError, match="backslash"):
        mf.compute(d)


def test_symlinked_files_are_followed_like_a_hub_snapshot(tmp_path):
    """Reference: hashlib over the blob the link points to."""
    repo = tmp_path / "models--o--n"  # huggingface_hub's cache layout: snapshots/REV/FILE -> ../../blobs/SHA
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "abc").write_bytes(b"weights")
    d = repo / "snapshots" / "0123"
    d.mkdir(parents=True)
    os.symlink(os.path.relpath(blobs / "abc", d), d / "model.safetensors")
    (entry,) = mf.compute(d).values()
    assert (entry.path, entry.sha256, entry.size) == ("model.safetensors", hashlib.sha256(b"weights").hexdigest(), 7)


def test_identity_checks_a_stored_manifest(tmp_path):
    d = _ckpt(tmp_path)
    computed = mf.identity(d)
    assert computed["manifest"] is None
    _, digest = mf.write(d)
    assert (
        mf.identity(d) == {"manifest": mf.MANIFEST, "manifest_digest": digest} and digest == computed["manifest_digest"]
    )
    (d / "config.json").write_bytes(b'{"a": 2}\n')
    with pytest.raises(mf.ManifestError, match="config.json differs"):
        mf.identity(d)


def test_manifest_command(tmp_path):
    d = _ckpt(tmp_path)
    res = runner.invoke(app, ["manifest", str(d)])
    assert res.exit_code == 0 and "--write writes it" in res.output and not (d / mf.MANIFEST).exists()
    res = runner.invoke(app, ["manifest", str(d), "--write"])
    assert res.exit_code == 0 and (d / mf.MANIFEST).is_file()
    assert not [p for p in d.iterdir() if "requant-tmp" in p.name]
    res = runner.invoke(app, ["manifest", str(d)])
    assert res.exit_code == 0 and "ok" in res.output
    (d / "config.json").write_bytes(b"changed")
    res = runner.invoke(app, ["manifest", str(d)])
    assert res.exit_code == 1 and "config.json differs" in res.output


def test_manifest_against_another_manifest(tmp_path):
    """--against checks a directory against another directory's list (a source check)."""
    src = _ckpt(tmp_path)
    other = tmp_path / "out"
    other.mkdir()
    (other / mf.SOURCE_MANIFEST).write_bytes(mf.render(mf.compute(src)))
    res = runner.invoke(app, ["manifest", str(src), "--against", str(other / mf.SOURCE_MANIFEST)])
    assert res.exit_code == 0, res.output
    (src / "LICENSE").write_text("changed")
    res = runner.invoke(app, ["manifest", str(src), "--against", str(other / mf.SOURCE_MANIFEST)])
    assert res.exit_code == 1 and "LICENSE differs" in res.output
