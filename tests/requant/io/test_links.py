"""Files that resolve outside a checkpoint are refused by every command that reads, hashes,
copies or uploads its directory; links inside it, and the Hugging Face cache's own snapshot
layout, are followed. References: the files on disk (tree_bytes before and after), the secret's
bytes searched for in every output, and hashlib over the blob a snapshot links to."""

import hashlib
import os
import shutil

import pytest
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint import open_checkpoint
from requant.cli import app
from requant.convert import convert
from requant.errors import CheckpointError
from requant.evidence import manifest as mf
from requant.evidence.verify import verify
from requant.io.links import LinkError
from tests.requant.conftest import leftovers, tree_bytes

runner = CliRunner()
SECRET = b"the secret the checkpoint must never carry\n"


@pytest.fixture
def secret(tmp_path):
    p = tmp_path / "elsewhere" / "secret.txt"
    p.parent.mkdir()
    p.write_bytes(SECRET)
    return p


@pytest.fixture
def linked_out(tmp_path, secret):
    """A copy of the default with notes.txt -> a file outside it (no SHA256SUMS: none to mismatch)."""
    d = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, d, ignore=shutil.ignore_patterns("SHA256SUMS"))
    os.symlink(secret, d / "notes.txt")
    return d


def _one_error_line(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_manifest_refuses_a_link_out_of_the_checkpoint(linked_out, secret):
    with pytest.raises(LinkError, match="outside the checkpoint") as exc:
        mf.compute(linked_out)
    assert "notes.txt" in str(exc.value) and str(secret) in str(exc.value)
    res = runner.invoke(app, ["manifest", str(linked_out), "--write"])
    _one_error_line(res, "notes.txt", str(secret))
    assert not (linked_out / mf.MANIFEST).exists()


def test_a_link_out_is_refused_even_where_the_manifest_does_not_cover_it(linked_out, secret):
    os.remove(linked_out / "notes.txt")
    os.remove(linked_out / "README.md")
    os.symlink(secret, linked_out / "README.md")  # push uploads README.md: it must not be a way out
    with pytest.raises(LinkError, match="README.md"):
        mf.compute(linked_out)


def test_convert_copies_no_file_from_outside(linked_out, tmp_path):
    before = tree_bytes(linked_out)
    out = tmp_path / "out"
    with pytest.raises(LinkError, match="notes.txt"):
        convert(linked_out, out, "nearest")
    res = runner.invoke(app, ["convert", str(linked_out), "-o", str(out)])
    _one_error_line(res, "notes.txt", "outside the checkpoint")
    assert leftovers(tmp_path, "out") == [] and tree_bytes(linked_out) == before


def test_unconstrained_convert_refuses_the_link_too(linked_out, tmp_path):
    # unconstrained hashes its source as well, but the copy itself must refuse: hand it the hashes
    entries = {}
    os.rename(linked_out / "notes.txt", tmp_path / "aside")
    entries.update(mf.compute(linked_out))
    os.rename(tmp_path / "aside", linked_out / "notes.txt")
    entries["notes.txt"] = mf.Entry("notes.txt", hashlib.sha256(SECRET).hexdigest(), len(SECRET))
    with pytest.raises(CheckpointError, match="notes.txt"):
        convert(linked_out, tmp_path / "out", "unconstrained", src_entries=entries)
    assert leftovers(tmp_path, "out") == []


def test_weights_or_config_linked_out_are_refused_at_open(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, d)
    away = tmp_path / "away"
    away.mkdir()
    for name in ("model.safetensors", "config.json"):
        if not (d / name).exists():
            continue
        shutil.move(d / name, away / name)
        os.symlink(away / name, d / name)
        with pytest.raises(LinkError, match=name):
            open_checkpoint(d)
        os.remove(d / name)
        shutil.move(away / name, d / name)
    open_checkpoint(d)


def test_links_inside_the_checkpoint_are_followed(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, d, ignore=shutil.ignore_patterns("SHA256SUMS"))
    (d / "docs").mkdir()
    os.symlink("../config.json", d / "docs" / "config-copy.json")
    entries = mf.compute(d)
    assert entries["docs/config-copy.json"].sha256 == hashlib.sha256((d / "config.json").read_bytes()).hexdigest()


def test_hub_snapshot_links_into_its_blobs_are_followed_and_nothing_else(tmp_path, secret):
    repo = tmp_path / "models--o--n"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123"
    snap.mkdir(parents=True)
    (repo / "blobs" / "aa").write_bytes(b"weights")
    os.symlink("../../blobs/aa", snap / "model.safetensors")
    assert mf.compute(snap)["model.safetensors"].sha256 == hashlib.sha256(b"weights").hexdigest()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("x")
    os.symlink("../../refs/main", snap / "ref.txt")  # inside the repo's cache, but not a blob
    with pytest.raises(LinkError, match="ref.txt"):
        mf.compute(snap)


def test_verify_applies_the_manifest_file_rules(tmp_path, secret):
    a = tmp_path / "a"
    shutil.copytree(DEFAULT_CHECKPOINT, a)
    b = tmp_path / "b"
    shutil.copytree(DEFAULT_CHECKPOINT, b)
    os.symlink(secret.parent, b / "linked-dir")  # was reported identical: a directory the walk skipped
    with pytest.raises(CheckpointError, match="symlinked directory"):
        verify(a, b)
    res = runner.invoke(app, ["verify", str(a), str(b)])
    _one_error_line(res, "linked-dir")
    os.remove(b / "linked-dir")
    os.symlink(secret, b / "notes.txt")
    with pytest.raises(LinkError, match="notes.txt"):
        verify(a, b)


def test_audit_refuses_a_link_out_before_running(linked_out):
    res = runner.invoke(app, ["audit", str(linked_out), "--backends", "reference", "--prompts", "1"])
    _one_error_line(res, "notes.txt", "outside the checkpoint")


def test_push_dry_run_lists_no_file_from_outside(linked_out, secret, hub):
    res = runner.invoke(app, ["push", str(linked_out), "requant-test/x", "--dry-run", "--force"])
    _one_error_line(res, "notes.txt")
    assert hub.requests == [] and SECRET.decode() not in res.output


def test_a_bf16_source_linked_out_is_refused(tmp_path):
    from requant.runtime.weights import Bf16Dir

    src = tmp_path / "bf16"
    shutil.copytree(DEFAULT_CHECKPOINT.parent / "default-bf16", src)
    away = tmp_path / "away"
    away.mkdir()
    shutil.move(src / "model.safetensors", away / "model.safetensors")
    os.symlink(away / "model.safetensors", src / "model.safetensors")
    with pytest.raises(LinkError, match="model.safetensors"):
        Bf16Dir(src, {})
