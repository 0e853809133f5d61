"""`requant push` when something fails after (or under) the commit, against the loopback Hub:
the Hub stores other bytes than were sent (its own hashes read back: exit 1 naming the file), a
local file rewritten after it was hashed, and the card's write-back failing after the commit
(exit 3, "pushed to URL (commit C); README.md could not be written back: ..."), the URL printed first."""

from __future__ import annotations

import errno
import hashlib

from typer.testing import CliRunner

from requant.cli import app
from requant.io import output, snapshot

runner = CliRunner()
REPO = "requant-test/tiny-pow2"


def _push(ckpt, *args):
    res = runner.invoke(app, ["push", str(ckpt), REPO, *args])
    assert "Traceback" not in res.output, res.output
    return res


def _error(res) -> str:
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    return line


def test_hub_holding_other_bytes_is_exit_1_naming_the_file(hub, pow2_copy):
    hub.corrupt.add("model.safetensors")
    res = _push(pow2_copy)
    assert res.exit_code == 1, res.output
    oid = hub.repos[REPO].branches["main"]
    assert res.stdout.splitlines()[0] == f"{hub.url}/{REPO}/commit/{oid}"  # said first: the commit exists
    stored = hashlib.sha256(hub.files(REPO)["model.safetensors"]).hexdigest()
    line = _error(res)
    assert f"pushed to {hub.url}/{REPO}/commit/{oid} (commit {oid[:12]})" in line
    assert f"model.safetensors: the Hub holds sha256 {stored}" in line


def test_a_plain_file_stored_otherwise_is_named_too(hub, pow2_copy):
    hub.corrupt.add("config.json")
    res = _push(pow2_copy)
    assert res.exit_code == 1, res.output
    assert "config.json: the Hub holds blob" in _error(res)


def test_file_rewritten_after_hashing_never_passes(hub, pow2_copy, monkeypatch):
    """config.json is hashed, then rewritten before the upload reads it: the upload refuses
    (exit 2, nothing pushed) or the Hub's hashes disagree (exit 1); never exit 0."""
    target = pow2_copy / "config.json"

    def hook(p):
        if p.name == "config.json":
            monkeypatch.setattr(snapshot, "after_pin", None)
            target.write_bytes(target.read_bytes() + b"\n")

    monkeypatch.setattr(snapshot, "after_pin", hook)
    res = _push(pow2_copy)
    assert res.exit_code in (1, 2), res.output
    assert "config.json" in _error(res)


def test_write_back_failing_after_the_commit_is_exit_3_with_the_url(hub, pow2_copy, monkeypatch):
    (pow2_copy / "README.md").unlink()  # the card is rendered now and written back after the commit

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "fsync_path", full)  # an ENOSPC at the writer, after the commit
    res = _push(pow2_copy)
    assert res.exit_code == 3, res.output
    oid = hub.repos[REPO].branches["main"]
    url = f"{hub.url}/{REPO}/commit/{oid}"
    assert res.stdout.splitlines()[0] == url
    line = _error(res)
    assert line.startswith(f"error: pushed to {url} (commit {oid[:12]}); README.md could not be written back: ")
    assert "No space left on device" in line
    assert not (pow2_copy / "README.md").exists()
    assert not [p.name for p in pow2_copy.iterdir() if p.name.startswith(".README.md")]
