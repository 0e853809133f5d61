"""What reaches the terminal: user-derived names printed as written (rich markup escaped, control
characters as escapes, one line), and a stdout nobody reads (closed, or a pipe whose reader left)
costing neither the files nor the verdict's exit code, with no traceback. Real processes and real
pipes for the latter (the embedded default, a few tokens). References: the bytes on stdout and
stderr, the files on disk, and the exit status of the same command with a readable stdout."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()
CODE = "import sys; from requant.cli import app; sys.argv[0] = 'requant'; app(sys.argv[1:], prog_name='requant')"
GEN = ["generate", "--prompt", "It is a truth", "--max-new-tokens", "4"]


def _run(args, cwd, **kw):
    return subprocess.run([sys.executable, "-c", CODE, *map(str, args)], cwd=cwd, capture_output=True, **kw)


@pytest.fixture
def record(tmp_path):
    rec = tmp_path / "g.jsonl"
    res = runner.invoke(app, [*GEN, "--json", str(rec)])
    assert res.exit_code == 0, res.output
    return rec


@pytest.mark.parametrize("name", ["[/]", "[red]", "[bold]x[/bold]"])
def test_a_json_name_with_rich_markup_is_printed_as_written(tmp_path, name, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "/" in name:
        os.makedirs(name.split("/")[0], exist_ok=True)
    target = f"{name}g.jsonl"
    res = runner.invoke(app, [*GEN, "--json", target])
    assert res.exit_code == 0, res.output
    assert f"wrote {target} (1 record)" in res.stderr.splitlines()
    res = runner.invoke(app, ["replay", target, "--json", f"{name}r.json"])
    assert res.exit_code == 0, res.output
    assert f"wrote {name}r.json" in res.stderr.splitlines()


def test_a_json_name_with_a_newline_stays_on_one_line(tmp_path):
    target = tmp_path / "a\nb.jsonl"
    res = runner.invoke(app, [*GEN, "--json", str(target)])
    assert res.exit_code == 0, res.output
    wrote = [ln for ln in res.stderr.splitlines() if ln.startswith("wrote ")]
    assert wrote == ["wrote " + str(target).replace("\n", "\\n") + " (1 record)"]
    assert target.is_file()


def test_an_esc_in_a_records_key_does_not_reach_stdout(tmp_path, record):
    rec = json.loads(record.read_text())
    rec["key"] = "\x1b[31mred\x1b]0;title\x07"
    evil = tmp_path / "evil.jsonl"
    evil.write_text(json.dumps(rec) + "\n")
    res = runner.invoke(app, ["replay", str(evil)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "key \\x1b[31mred\\x1b]0;t" in res.stdout  # the key's first 16 characters, escaped


def test_a_closed_stdout_keeps_generates_json_and_exit_code(tmp_path):
    res = _run([*GEN, "--json", "g.jsonl"], tmp_path, stdout=None, preexec_fn=lambda: os.close(1))
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert json.loads((tmp_path / "g.jsonl").read_text())["key"]


def test_a_closed_stdout_keeps_replays_verdict(tmp_path, record):
    res = _run(["replay", record, "--json", "r.json"], tmp_path, stdout=None, preexec_fn=lambda: os.close(1))
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_a_closed_stdout_keeps_determinisms_and_audits_verdicts(tmp_path):
    for args, out in (
        (["determinism", "--prompts", "1", "--new-tokens", "2", "--json", "d.json"], "d.json"),
        (["audit", "--prompts", "1", "--phases", "prefill", "--json", "a.json"], "a.json"),
    ):
        res = _run(args, tmp_path, stdout=None, preexec_fn=lambda: os.close(1))
        assert res.returncode == 0 and b"Traceback" not in res.stderr, (args, res.stderr)
        assert (tmp_path / out).is_file()


def test_a_pipe_whose_reader_left_keeps_the_files_and_exit_code(tmp_path):
    r, w = os.pipe()
    os.close(r)  # every write to stdout now fails with EPIPE
    try:
        res = subprocess.run(
            [sys.executable, "-c", CODE, *GEN, "--json", "g.jsonl"], cwd=tmp_path, stdout=w, stderr=subprocess.PIPE
        )
    finally:
        os.close(w)
    assert res.returncode == 0, res.stderr
    assert b"Broken pipe" not in res.stderr and b"Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "g.jsonl").is_file()


def test_generate_into_head(tmp_path):
    cmd = f'"{sys.executable}" -c "{CODE}" generate --prompt "It is a truth" --max-new-tokens 32 --json g.jsonl'
    res = subprocess.run(
        ["bash", "-c", cmd + ' | head -c 5; echo " rc=${PIPESTATUS[0]}"'], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.stdout == "It is rc=0\n", res
    assert "Broken pipe" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "g.jsonl").is_file()
