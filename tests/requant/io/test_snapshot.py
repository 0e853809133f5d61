"""requant.io.snapshot: a command whose input changes while it reads it ends in exit 2 with one
line naming the file, and writes nothing (never a report whose halves measured different bytes).

Deterministic, no timing race: the module's `after_pin` hook rewrites the input at the k-th time
a read pins it (k = the first, a middle and the last pin of that command, counted in a clean run
first), in place (same inode and size: only mtime/ctime move) or by a rename (a new inode)."""

from __future__ import annotations

import os
import shutil

import pytest

from requant.checkpoint.synthetic import generate
from requant.io import snapshot
from requant.io.safetensors_io import read_header
from tests.requant.commands.cli import invoke, refused
from tests.requant.conftest import MICRO

COMMANDS = {
    "audit": lambda ck, out: ["audit", ck, "--json", out],
    "determinism": lambda ck, out: ["determinism", ck, "--json", out, "--prompts", "1", "--new-tokens", "2"],
    "inspect": lambda ck, out: ["inspect", ck, "--json"],
    "convert": lambda ck, out: ["convert", ck, "-o", out, "--arm", "nearest"],
}


def _flip_last_byte_in_place(path):
    """One data byte of the last tensor changed where it lies: same inode, same size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size - 1)
        b = f.read(1)
        f.seek(size - 1)
        f.write(bytes([b[0] ^ 0x01]))


def _replace_by_rename(path):
    tmp = path.with_name(path.name + ".new")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def micro_src(tmp_path_factory):
    return generate(MICRO, tmp_path_factory.mktemp("snap") / "micro", seed=1)


def _pins(monkeypatch, args, name="model.safetensors") -> int:
    seen = []
    monkeypatch.setattr(snapshot, "after_pin", lambda p: seen.append(p.name))
    res = invoke(*args)
    assert res.exit_code in (0, 1), res.output
    return seen.count(name)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_input_rewritten_mid_run_is_exit_2_and_writes_nothing(command, micro_src, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    shutil.copytree(micro_src, clean)
    n = _pins(monkeypatch, COMMANDS[command](clean, tmp_path / "clean.json"))
    assert n >= 2  # the header read and at least one more read of the weights
    for k in sorted({0, n // 2, n - 1}):
        for how in (_flip_last_byte_in_place, _replace_by_rename):
            ck = tmp_path / f"ck{k}{how.__name__}"
            shutil.copytree(micro_src, ck)
            report = tmp_path / f"{ck.name}.json"
            count = [0]

            def hook(p, k=k, how=how, count=count):
                if p.name == "model.safetensors":
                    if count[0] == k:
                        how(p)
                    count[0] += 1

            monkeypatch.setattr(snapshot, "after_pin", hook)
            res = invoke(*COMMANDS[command](ck, report))
            # convert says it its own way (requant.convert._check_unchanged): the file, the change, nothing written
            line = refused(res, "model.safetensors", "changed while it was", "nothing was written")
            assert str(ck) in line
            assert not report.exists() and not list(tmp_path.glob(f".{report.name}*"))


def test_verify_of_a_side_that_changes_is_exit_2_never_identical(micro_src, tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(micro_src, a)
    shutil.copytree(micro_src, b)

    def hook(p):
        if p == b / "model.safetensors":
            _flip_last_byte_in_place(p)
            monkeypatch.setattr(snapshot, "after_pin", None)

    monkeypatch.setattr(snapshot, "after_pin", hook)
    res = invoke("verify", a, b)
    refused(res, f"{b / 'model.safetensors'} changed while it was read")
    assert "identical" not in res.stdout


def test_unchanged_inputs_pass_and_pins_are_kept_only_inside_a_command(micro_src, tmp_path):
    assert invoke("verify", micro_src, micro_src).exit_code == 0
    read_header(micro_src / "model.safetensors")  # outside a command: nothing is pinned
    assert snapshot.pinned() == 0
    with snapshot.watching():
        read_header(micro_src / "model.safetensors")
        assert snapshot.pinned() == 1
        snapshot.check()
    assert snapshot.pinned() == 0
