"""A Hub repo id resolved through huggingface_hub.snapshot_download from a pre-populated
local cache with HF_HUB_OFFLINE=1 (no network). The cache is built the way the hub
library lays it out: blobs named by content hash, snapshot files as relative symlinks,
refs/main holding the commit. Reference: the files copied into the cache."""

import hashlib
import json
import os

import huggingface_hub.constants
import pytest
import torch

from requant.checkpoint import open_checkpoint
from requant.convert import convert
from requant.errors import LayoutError
from tests.requant.conftest import tree_bytes

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _populate(cache, repo, src, commit=COMMIT):
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for p in sorted(src.iterdir()):
        data = p.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / p.name)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # the hub library reads its environment once, at import: set the parsed values too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_repo_id_resolves_from_offline_cache(tmp_path, offline_cache, micro_sharded):
    snap = _populate(offline_cache, "requant-test/micro-w8a8", micro_sharded)
    ck = open_checkpoint("requant-test/micro-w8a8")
    assert ck.path.resolve() == snap.resolve()
    assert len(ck.quantized_linears) == 14 and ck.is_sharded
    # same tensors as the local directory
    local = open_checkpoint(micro_sharded)
    for name in local.tensor_names():
        assert ck.tensor(name).reshape(-1).view(torch.uint8).equal(local.tensor(name).reshape(-1).view(torch.uint8))
    before = tree_bytes(snap)
    out = tmp_path / "out"
    convert("requant-test/micro-w8a8", out, "unconstrained")
    assert tree_bytes(out) == tree_bytes(micro_sharded)  # symlinks followed, bytes kept
    convert("requant-test/micro-w8a8", tmp_path / "pow2", "ceiling", revision=COMMIT)
    assert tree_bytes(snap) == before  # the cache is untouched
    prov = json.loads((tmp_path / "pow2" / "config.json").read_text())["requant"]
    assert prov["source"] == {"id": "requant-test/micro-w8a8", "revision": COMMIT}  # the snapshot resolved


def test_unknown_repo_offline_is_a_clear_error(offline_cache):
    with pytest.raises(LayoutError) as ei:
        open_checkpoint("requant-test/not-cached")
    msg = str(ei.value)
    assert msg.startswith("requant-test/not-cached: no such directory") and "not in the local cache" in msg
    assert "HF_HUB_OFFLINE" in msg and "Error" not in msg and "\n" not in msg


def test_output_inside_cache_snapshot_refused(tmp_path, offline_cache, micro):
    snap = _populate(offline_cache, "requant-test/micro", micro)
    with pytest.raises(Exception, match="inside the source"):
        convert("requant-test/micro", snap / "out", "nearest")
