"""convert's provenance is of the bytes it converted, and what requant writes is readable as
cp would leave it; interrupted writers leave nothing.

* A source shard rewritten in place while convert runs (between the reads of the conversion
  and those of the hasher) is refused, naming the shard, and nothing is written; untouched,
  SHA256SUMS.source lists hashlib's sha256 of each source file (the independent reference).
* Files of requant.checkpoint.synthetic, of a converted checkpoint and of `manifest --write` get
  0666 & ~umask, as `cp` gives a new file (reference: that arithmetic, under two umasks).
* `manifest --write` interrupted, and eval interrupted while an arm is converted, leave no
  temporary file or directory (reference: the directory listings).
"""

import hashlib
import os
import stat
import time

import pytest
from typer.testing import CliRunner

import requant.convert
from requant.checkpoint.synthetic import generate
from requant.cli import app
from requant.convert import _streaming as streaming
from requant.convert import convert
from requant.errors import CheckpointError
from requant.evidence import manifest as mf
from tests.requant.conftest import MICRO

runner = CliRunner()


@pytest.fixture
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_a_source_shard_modified_during_convert_is_refused(micro_sharded, tmp_path, monkeypatch):
    real_run = streaming.run
    victim = sorted(micro_sharded.glob("*.safetensors"))[1]

    def run_then_modify(job, units, workers):
        real_run(job, units, workers)
        time.sleep(0.05)  # past the filesystem's timestamp granularity
        with open(victim, "r+b") as f:  # same size, same inode: only the bytes and the times change
            f.seek(os.path.getsize(victim) - 1)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))

    monkeypatch.setattr(streaming, "run", run_then_modify)
    with pytest.raises(CheckpointError, match="changed while it was being converted") as info:
        convert(micro_sharded, tmp_path / "out", "nearest")
    assert victim.name in str(info.value)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".out." in p.name]


def test_a_source_config_rewritten_after_it_was_parsed_is_refused(micro, tmp_path, monkeypatch):
    # config.json as read again before any byte is converted: not what open_checkpoint parsed
    monkeypatch.setattr(requant.convert, "load_json", lambda path, what: {"rewritten": True})
    with pytest.raises(CheckpointError, match="config.json: changed while"):
        convert(micro, tmp_path / "out", "nearest")
    assert not (tmp_path / "out").exists()


def test_an_untouched_source_is_listed_with_the_sha256_of_its_files(micro_sharded, tmp_path):
    convert(micro_sharded, tmp_path / "out", "nearest")
    listed, _ = mf.read(tmp_path / "out", mf.SOURCE_MANIFEST)
    for rel, h in listed.items():
        assert h == hashlib.sha256((micro_sharded / rel).read_bytes()).hexdigest(), rel


@pytest.mark.parametrize("umask", [0o022, 0o002], indirect=True)
def test_checkpoint_files_get_0666_less_the_umask_as_cp_gives(tmp_path, umask):
    want = 0o666 & ~umask
    src = generate(MICRO, tmp_path / "src", seed=1, shard_size=4096, keep_source=tmp_path / "bf16")
    convert(src, tmp_path / "out", "nearest")
    runner.invoke(app, ["manifest", str(src), "--write"])
    for d in ("src", "bf16", "out"):
        files = [p for p in (tmp_path / d).iterdir() if p.is_file()]
        assert files
        modes = {p.name: oct(stat.S_IMODE(os.stat(p).st_mode)) for p in files}
        assert set(modes.values()) == {oct(want)}, (d, modes)


def test_manifest_write_interrupted_leaves_no_file(micro, monkeypatch):
    import requant.io.output

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(requant.io.output, "fsync_path", interrupted)
    before = sorted(p.name for p in micro.iterdir())
    res = runner.invoke(app, ["manifest", str(micro), "--write"])
    assert res.exit_code == 130, res.output
    assert sorted(p.name for p in micro.iterdir()) == before


def test_eval_interrupted_while_an_arm_runs_removes_its_temporary_checkpoint(micro, tmp_path, monkeypatch):
    import tempfile

    import requant.eval.run as run

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen = []

    def interrupted(path, *a, **k):
        seen.append(sorted(os.listdir(path)))
        if len(seen) == 2:  # native first, then the converted arm, which exists while it is evaluated
            raise KeyboardInterrupt
        return {"tasks": {}}

    monkeypatch.setattr(run, "evaluate_row", interrupted)
    monkeypatch.setattr(run, "load_tasks", lambda tasks: None)
    with pytest.raises(KeyboardInterrupt):
        run.run_eval(str(micro), ["nearest"], limit=1)
    assert len(seen) == 2 and "SHA256SUMS" in seen[1]
    assert os.listdir(scratch) == []


def test_an_empty_heldout_document_is_refused_naming_the_line(tmp_path, monkeypatch):
    import requant.eval.task as task

    p = tmp_path / "docs.jsonl"
    p.write_text('{"title": "a", "text": "Some words."}\n{"title": "b", "text": "  "}\n')
    monkeypatch.setattr(task, "HELDOUT_FILE", p)
    with pytest.raises(ValueError, match=r"docs.jsonl: line 2: a document needs a non-empty"):
        task.heldout_docs()


def test_eval_refuses_a_source_changed_between_its_hashing_and_an_arms_conversion(micro, monkeypatch):
    import requant.eval.run as run

    real_identity = run._identity

    def identity_then_modify(checkpoint, progress, entries_out):
        ident = real_identity(checkpoint, progress, entries_out)
        time.sleep(0.05)  # past the filesystem's timestamp granularity
        shard = micro / "model.safetensors"
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        with open(shard, "r+b") as f:  # in place: same inode and size
            f.write(data)
        return ident

    monkeypatch.setattr(run, "_identity", identity_then_modify)
    monkeypatch.setattr(run, "evaluate_row", lambda *a, **k: {"tasks": {}})
    monkeypatch.setattr(run, "load_tasks", lambda tasks: None)
    with pytest.raises(CheckpointError, match="model.safetensors: changed while it was being converted"):
        run.run_eval(str(micro), ["nearest"], limit=1)


@pytest.mark.parametrize("shard_replaced", [True, False])
def test_a_file_that_vanishes_while_the_others_are_copied(micro, tmp_path, monkeypatch, shard_replaced):
    """A writer replacing the shard by rename leaves its temporary file in the source for a moment:
    listed by the copy of the other files, gone when copied. With the shard replaced, convert names
    the shard as changed (the cause), not the vanished file; a stray file that vanishes while the
    source is otherwise untouched fails its copy, named. Nothing is written either way. (Seen in CI
    as a race of tests/requant/io/test_snapshot.py, the hasher's thread replacing the shard.)"""
    real_walk = streaming.walk_files
    shard = micro / "model.safetensors"

    def walk_then_replace(root, skip):
        files = real_walk(root, skip)
        stray = shard.with_name("model.safetensors.new")
        files = {**files, stray.name: stray}  # listed now; renamed over the shard before its copy
        if shard_replaced:
            data = bytearray(shard.read_bytes())
            data[-1] ^= 0x01
            stray.write_bytes(bytes(data))
            os.replace(stray, shard)
        return files

    monkeypatch.setattr(streaming, "walk_files", walk_then_replace)
    if shard_replaced:
        with pytest.raises(CheckpointError, match="model.safetensors: changed while it was being converted"):
            convert(micro, tmp_path / "out", "nearest")
    else:
        with pytest.raises(CheckpointError, match=r"copying .*model.safetensors.new failed"):
            convert(micro, tmp_path / "out", "nearest")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".out." in p.name]
