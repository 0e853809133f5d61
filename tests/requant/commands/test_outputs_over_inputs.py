"""No output lands on an input: every case the reliability probe found, through the real cli.app,
each refused with exit 2 and one `error:` line naming the option and the input, before any work,
with the inputs byte for byte as they were. References: the bytes of every input file before and
after (tree_bytes), and, for the enumeration, click's own list of each command's parameters."""

import os
import shutil

import pytest
import typer.main
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from requant.commands._guards import RequantCommand, input_params, output_params
from tests.requant.commands.cli import open_checkpoint_fails

from ..conftest import tree_bytes

runner = CliRunner()


@pytest.fixture
def ck(tmp_path):
    dst = tmp_path / "CK"
    shutil.copytree(DEFAULT_CHECKPOINT, dst)
    return dst


@pytest.fixture
def no_work(monkeypatch):
    open_checkpoint_fails(monkeypatch, "the work started before the outputs were checked against the inputs")


def _refused(args, *words, inputs=()):
    before = {str(p): tree_bytes(p) if p.is_dir() else p.read_bytes() for p in inputs}
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and "Traceback" not in res.output, res.output
    for w in words:
        assert str(w) in errors[0], errors[0]
    after = {str(p): tree_bytes(p) if p.is_dir() else p.read_bytes() for p in inputs}
    assert after == before
    return errors[0]


def test_generate_json_on_the_checkpoints_weights(ck, no_work):
    _refused(
        ["generate", ck, "--prompt", "x", "--json", ck / "model.safetensors"],
        "--json",
        "inside the checkpoint",
        inputs=[ck],
    )


def test_generate_json_on_the_checkpoints_config(ck, no_work):
    _refused(
        ["generate", ck, "--prompt", "x", "--json", ck / "config.json"], "--json", "inside the checkpoint", inputs=[ck]
    )


def test_generate_json_through_a_symlink_into_the_checkpoint(ck, tmp_path, no_work):
    link = tmp_path / "record.jsonl"
    link.symlink_to(ck / "model.safetensors")
    _refused(
        ["generate", ck, "--prompt", "x", "--json", link], "--json", str(link), "inside the checkpoint", inputs=[ck]
    )


def test_generate_json_over_its_prompts_file(tmp_path, no_work):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    _refused(["generate", "--prompts", p, "--json", p], "--json", "is --prompts", inputs=[p])


def test_replay_json_over_the_record_it_replays(tmp_path, no_work):
    rec = tmp_path / "r.jsonl"
    rec.write_text('{"not": "read before the check"}\n')
    _refused(["replay", rec, "--json", rec], "--json", "is RECORD", inputs=[rec])


def test_replay_json_inside_the_records_checkpoint(ck, tmp_path):
    # the checkpoint a record names is known only once the record is read: checked then, before the run
    rec = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["generate", str(ck), "--prompt", "x", "--max-new-tokens", "2", "--json", str(rec)])
    assert res.exit_code == 0, res.output
    _refused(
        ["replay", rec, "--json", ck / "replay.json"], "--json", "inside the record's checkpoint", inputs=[ck, rec]
    )


def test_determinism_json_on_the_checkpoints_config(ck, no_work):
    _refused(["determinism", ck, "--json", ck / "config.json"], "--json", "inside the checkpoint", inputs=[ck])


def test_audit_plan_json_on_the_checkpoints_config(ck):
    _refused(["audit", ck, "--plan", "--json", ck / "config.json"], "--json", "inside the checkpoint", inputs=[ck])
    # CKPT given as the config.json itself: the output is that very file
    _refused(["audit", ck / "config.json", "--plan", "--json", ck / "config.json"], "--json", "is the checkpoint")


def test_audit_report_into_the_checkpoint(ck, no_work):
    _refused(["audit", ck, "--report", f"{ck}/"], "--report", inputs=[ck])
    _refused(["audit", ck, "--report", ck / "reports"], "--report", "inside the checkpoint", inputs=[ck])


def test_a_hard_link_to_an_input_file_is_refused(ck, tmp_path, no_work):
    hard = tmp_path / "a.json"
    os.link(ck / "config.json", hard)
    _refused(["determinism", ck, "--json", hard], "--json", "hard link", inputs=[ck])


def test_two_outputs_that_are_the_same_file(tmp_path, no_work):
    _refused(["audit", "--json", tmp_path / "r" / "audit.json", "--report", tmp_path / "r"], "the same file as --json")
    link = tmp_path / "b.json"
    link.symlink_to("a.json")
    _refused(["convert", "-o", tmp_path / "out", "--json", tmp_path / "a.json", "--plot", link], "the same file")


def test_card_over_its_own_audit_report(ck, tmp_path):
    (ck / "README.md").write_text('{"written": "by hand"}\n')
    _refused(["card", ck, "--audit", ck / "README.md"], "the card", "--audit", inputs=[ck])


def test_a_report_beside_the_checkpoint_in_its_slot_is_written(ck):
    # requant-audit.json is not covered by the manifest (the Quickstart keeps it there): allowed
    res = runner.invoke(app, ["audit", str(ck), "--plan", "--json", str(ck / "requant-audit.json")])
    assert res.exit_code == 0, res.output
    assert (ck / "requant-audit.json").is_file()


# -- every command's output options go through the check ---------------------------------
# How to call each command with an input (a copy of the embedded default, CK, or a record R),
# and the inputs its parameters name (anything not an output): a command or a path parameter
# missing here fails the test, so that a new one is classified before it ships.
BASE = {
    "convert": ["{ck}", "-o", "{t}/out"],
    "audit": ["{ck}"],
    "determinism": ["{ck}"],
    "eval": ["{ck}"],
    "tp-check": ["{ck}"],
    "generate": ["{ck}", "--prompt", "x"],
    "replay": ["{rec}"],
    "conform": ["--backend", "reference-cutlass-order"],
}
INPUTS = {
    "convert": {"SRC", "--source"},
    "inspect": {"SRC"},
    "verify": {"A", "B"},
    "audit": {"CKPT"},
    "conform": set(),
    "determinism": {"CKPT"},
    "eval": {"CKPT", "--source"},
    "manifest": {"CKPT", "--against"},
    "card": {"CKPT", "--audit", "--eval", "--determinism", "--convert"},
    "push": {"CKPT"},
    "tp-check": {"CKPT"},
    "generate": {"CKPT", "--prompts"},
    "replay": {"RECORD", "--checkpoint"},
}


def _commands():
    group = typer.main.get_command(app)
    return group.commands


def test_every_command_is_classified_and_guarded():
    for name, command in _commands().items():
        assert isinstance(command, RequantCommand), name
        assert name in INPUTS, f"{name}: a new command; list its inputs (and BASE if it writes)"
        assert set(input_params(command)) == INPUTS[name], name
        assert bool(output_params(command)) == (name in BASE), name


@pytest.mark.parametrize(
    "name,flag",
    [(n, f) for n, c in sorted(_commands().items()) for f in sorted(output_params(c))],
)
def test_every_output_option_is_refused_on_an_input(name, flag, ck, tmp_path, no_work):
    rec = tmp_path / "r.jsonl"
    rec.write_text("{}\n")
    args = [name] + [a.format(ck=ck, t=tmp_path, rec=rec) for a in BASE[name]]
    if name == "conform":  # no input: its two outputs may not be one file
        other = ["--export", tmp_path / "v"] if flag == "--json" else ["--json", tmp_path / "v" / "vectors.json"]
        target = tmp_path / "v" / "vectors.json" if flag == "--json" else tmp_path / "v"
        _refused(args + [flag, target] + other, "the same file")
        return
    if name == "replay":
        _refused(args + [flag, rec], flag, "RECORD", inputs=[rec])
        return
    if name == "convert" and flag == "--output":
        args = args[:2]
        target = ck / "sub"
    else:
        target = ck / ("config.json" if flag in ("--json", "--plot") else "sub")
    _refused(args + [flag, target], flag if flag != "--output" else "-o", inputs=[ck])


def test_a_report_slot_hard_linked_to_the_weights_is_refused(ck, no_work):
    os.link(ck / "model.safetensors", ck / "requant-determinism.json")
    _refused(["determinism", ck, "--json", ck / "requant-determinism.json"], "--json", "hard link", inputs=[ck])


@pytest.mark.parametrize("command", ["generate", "replay", "determinism"])
def test_json_through_a_symlink_to_another_checkpoints_file_is_refused(ck, tmp_path, no_work, command):
    # the probe's case: LINK -> a file of a checkpoint the run does not read; it was written through
    other = tmp_path / "other"
    shutil.copytree(DEFAULT_CHECKPOINT, other)
    record = tmp_path / "r.jsonl"
    record.write_text("{}\n")
    (tmp_path / "r2.json").write_text("{}")  # a regular file beside the link: refused all the same
    for target in (other / "config.json", tmp_path / "absent.json", tmp_path / "r2.json"):
        link = tmp_path / "link.json"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        args = {
            "generate": ["generate", ck, "--prompt", "x"],
            "replay": ["replay", record],
            "determinism": ["determinism", ck],
        }[command]
        _refused([*args, "--json", link], "--json", str(link), "symbolic link", inputs=[ck, other])
        assert link.is_symlink() and os.readlink(link) == str(target) and not (tmp_path / "absent.json").exists()
