"""Inputs a checkpoint (or a report) can hold that must neither hang, exhaust memory, escape
the checkpoint, crash with a traceback nor reach the terminal raw: FIFOs and devices where a
small text file belongs, links out, JSON nested 100,000 deep, sizes of 0 and a head_dim the
tensors contradict, file names with ESC sequences and rich `:emoji:` codes. Every refusal is
exit 2 with one `error:` line naming the file or field. References: the bytes written here
(what a correct reader must refuse or print), and SIGALRM as the watchdog for a read that
would block forever."""

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from requant.checkpoint import open_checkpoint
from requant.cli import app
from requant.errors import CheckpointError
from requant.evidence import manifest as mf

runner = CliRunner()
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def watchdog():
    """Fail instead of hanging: a read that blocks (a FIFO with no writer) is interrupted."""

    def fire(signum, frame):
        raise AssertionError("blocked on a read")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _one_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [["manifest"], ["convert", "-o", "{out}"]])
def test_sha256sums_that_is_a_fifo_is_refused_without_hanging(micro, tmp_path, watchdog, command):
    os.mkfifo(micro / mf.MANIFEST)
    res = runner.invoke(
        app,
        [a.format(out=tmp_path / "out") for a in command[:1]]
        + [str(micro)]
        + [a.format(out=tmp_path / "out") for a in command[1:]],
    )
    _one_error(res, "SHA256SUMS", "FIFO")


def test_sha256sums_linked_to_dev_zero_is_refused_without_reading_it(micro, watchdog):
    (micro / mf.MANIFEST).symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        mf.read(micro)


def test_sha256sums_linked_to_etc_passwd_is_refused_as_a_link_out(micro):
    (micro / mf.MANIFEST).symlink_to("/etc/passwd")
    _one_error(runner.invoke(app, ["manifest", str(micro)]), "SHA256SUMS", "outside the checkpoint")


def test_against_manifest_that_is_a_device_is_refused(micro):
    with pytest.raises(CheckpointError, match="device"):
        mf.read(micro, "/dev/zero")


def test_config_json_that_is_a_fifo_is_refused(micro, watchdog):
    (micro / "config.json").unlink()
    os.mkfifo(micro / "config.json")
    with pytest.raises(CheckpointError, match="config.json is a FIFO"):
        open_checkpoint(micro)


def test_a_text_input_larger_than_the_cap_is_refused_unread(tmp_path):
    from requant.io.inputs import read_small

    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(65 << 20)  # sparse: costs no disk
    with pytest.raises(CheckpointError, match="more than the"):
        read_small(p, what="config.json")


def test_a_shard_that_is_a_fifo_is_refused_without_hanging(micro, watchdog):
    (micro / "model.safetensors").unlink()
    os.mkfifo(micro / "model.safetensors")
    with pytest.raises(CheckpointError, match="FIFO"):
        open_checkpoint(micro)


@pytest.mark.parametrize(
    "command", [["inspect"], ["convert", "-o", "{out}"], ["verify", "{other}"], ["audit", "--plan"]]
)
def test_deeply_nested_json_in_config_json_is_exit_2_one_line(micro, tmp_path, command):
    (micro / "config.json").write_bytes(DEEP)
    args = [command[0], str(micro)] + [a.format(out=tmp_path / "out", other=micro) for a in command[1:]]
    if command[0] == "verify":
        args = ["verify", str(micro), str(micro)]
    res = runner.invoke(app, args)
    if command[0] == "verify":  # verify compares bytes and never parses config.json: identical
        assert res.exit_code == 0, res.output
        return
    _one_error(res, "config.json", "nested too deeply")


def test_deeply_nested_safetensors_header_is_refused_naming_the_file(micro):
    from requant.io.safetensors_io import read_header

    header = b'{"a":' + DEEP + b"}"
    p = micro / "model.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match="nested too deeply") as info:
        read_header(p)
    assert "model.safetensors" in str(info.value)


def test_deeply_nested_index_json_is_refused(micro_sharded):
    (micro_sharded / "model.safetensors.index.json").write_bytes(DEEP)
    _one_error(runner.invoke(app, ["inspect", str(micro_sharded)]), "index", "nested too deeply")


@pytest.mark.parametrize("command", ["card", "push"])
def test_deeply_nested_report_is_exit_2_one_line(micro, tmp_path, command):
    (micro / "requant-audit.json").write_bytes(DEEP)
    args = ["card", str(micro), "--stdout"] if command == "card" else ["push", str(micro), "me/x", "--dry-run"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "nested too deeply" in res.stderr and "requant-audit.json" in res.stderr


def _set_config(ckpt, **fields):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(fields)
    (ckpt / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "field,value", [("num_key_value_heads", 0), ("num_attention_heads", 0), ("hidden_size", -4), ("head_dim", "16")]
)
def test_config_sizes_that_are_not_positive_integers_are_refused_naming_the_field(micro, field, value):
    _set_config(micro, **{field: value})
    res = runner.invoke(app, ["audit", str(micro), "--backends", "reference", "--prompts", "1"])
    _one_error(res, field, "positive integer")


def test_head_dim_inconsistent_with_the_tensors_is_refused_naming_head_dim(micro):
    _set_config(micro, head_dim=8)  # the micro model's tensors are 16 wide per head
    res = runner.invoke(app, ["tp-check", str(micro), "--tp", "1"])
    _one_error(res, "head_dim 8", "q_proj")


def test_file_names_with_escape_sequences_never_reach_the_terminal_raw(micro, tmp_path):
    runner.invoke(app, ["manifest", str(micro), "--write"])
    evil = "evil\x1b]0;pwned\x07\x1b[2J.txt"
    (micro / evil).write_text("x")
    res = runner.invoke(app, ["manifest", str(micro)])
    assert res.exit_code == 1 and "\x1b" not in res.output and "\x07" not in res.output
    assert "evil\\x1b]0;pwned\\x07" in res.stdout
    other = tmp_path / "other"
    other.mkdir()
    res = runner.invoke(app, ["verify", str(micro), str(other)])
    assert "\x1b" not in res.output and "evil\\x1b" in res.stdout


def test_emoji_codes_in_names_are_printed_literally(tmp_path):
    d = tmp_path / "emo:fire:dir"
    d.mkdir()
    line = _one_error(runner.invoke(app, ["inspect", str(d)]))
    assert "emo:fire:dir" in line and "\N{FIRE}" not in line


def test_emoji_codes_in_a_written_path_are_printed_literally(micro, tmp_path):
    res = runner.invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out:thumbsup:"), "-q"])
    assert res.exit_code == 0 and "out:thumbsup:" in res.stdout and "\N{THUMBS UP SIGN}" not in res.stdout


def test_crlf_manifest_line_is_named_without_a_raw_carriage_return(micro):
    runner.invoke(app, ["manifest", str(micro), "--write"])
    data = (micro / mf.MANIFEST).read_bytes().replace(b"\n", b"\r\n")
    (micro / mf.MANIFEST).write_bytes(data)
    line = _one_error(runner.invoke(app, ["manifest", str(micro)]), "SHA256SUMS", "line 1", "CR LF")
    assert "\\r" not in line and "\r" not in line


def test_tokenizer_json_that_is_a_fifo_is_refused_not_read_as_missing(micro, watchdog):
    from requant.models.tokenizer import TokenizerError, load_tokenizer

    os.mkfifo(micro / "tokenizer.json")
    with pytest.raises(TokenizerError, match="tokenizer.json is a FIFO"):
        load_tokenizer(micro, 64)


def test_manifest_printed_to_a_terminal_escapes_control_characters_but_piped_keeps_the_bytes(micro, monkeypatch):
    import requant.commands.publish as publish

    (micro / "evil\x1b[2J.txt").write_text("x")
    piped = runner.invoke(app, ["manifest", str(micro)])
    assert "  evil\x1b[2J.txt\n" in piped.stdout  # sha256sum -c reads the exact names
    real_out = publish.out

    def terminal():
        console = real_out()
        monkeypatch.setattr(console.file, "isatty", lambda: True, raising=False)
        return console

    monkeypatch.setattr(publish, "out", terminal)
    shown = runner.invoke(app, ["manifest", str(micro)])
    assert "\x1b" not in shown.stdout and "evil\\x1b[2J.txt" in shown.stdout
