"""A new user's first commands: the README's words match the options, --force never deletes the
reports a user wrote into an output, a report's missing parent directory is refused (never
created), a clone in the current directory that shadows the package is named in one line, the
help names the embedded default, --engine fast on a CPU says up front that it is slow, and progress
lines carry no source locations. References: the CLI's own option lists, the files on disk
before and after, and the processes' output."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from requant.cli import app

from ..conftest import tree_bytes

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]


def _options(name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]
    return {o for p in command.params for o in p.opts if o.startswith("--")}


def test_the_readme_names_the_backend_options_each_command_has():
    # every `COMMAND ... (--backend|--backends ...)` the README's CPU sentence pairs must exist
    text = (ROOT / "README.md").read_text()
    sentence = text.split("On CPU the audit", 1)[1].split("\n\n", 1)[0]
    assert "`--backends reference`" in sentence and "`--backend reference-triton-order`" in sentence
    for name in ("audit", "determinism"):
        assert "--backends" in _options(name)
    for name in ("eval", "generate"):
        assert "--backend" in _options(name) and "--backends" not in _options(name), name


def test_convert_force_refuses_an_output_holding_a_users_reports(tmp_path):
    out = tmp_path / "pow2"
    assert runner.invoke(app, ["convert", "-o", str(out), "-q"]).exit_code == 0
    assert runner.invoke(app, ["convert", "-o", str(out), "-q", "--force"]).exit_code == 0  # its own files only
    (out / "requant-audit.json").write_text('{"an": "audit"}\n')
    (out / "README.md").write_text("# the card\n")
    before = tree_bytes(out)
    res = runner.invoke(app, ["convert", "-o", str(out), "-q", "--force"])
    assert res.exit_code == 2, res.output
    assert "README.md, requant-audit.json" in res.stderr and "--force never deletes them" in res.stderr
    assert tree_bytes(out) == before


@pytest.mark.parametrize(
    "args,option",
    [
        (["audit", "--plan", "--json", "{m}/a.json"], "--json"),
        (["determinism", "--json", "{m}/d.json"], "--json"),
        (["generate", "--prompt", "x", "--json", "{m}/g.jsonl"], "--json"),
        (["eval", "--report", "{m}/report"], "--report"),
        (["conform", "--backend", "reference-cutlass-order", "--export", "{m}/vectors"], "--export"),
        (["convert", "-o", "{t}/out", "--plot", "{m}/p.png"], "--plot"),
    ],
    ids=["audit-json", "determinism-json", "generate-json", "eval-report", "conform-export", "convert-plot"],
)
def test_a_missing_parent_of_a_report_is_refused_not_created(tmp_path, args, option):
    missing = tmp_path / "nonexistent" / "dir"
    res = runner.invoke(app, [a.format(m=missing, t=tmp_path) for a in args])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {option}"), res.stderr
    assert "does not exist" in errors[0] and str(missing) in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_importing_from_the_directory_holding_a_clone_says_what_happened(tmp_path):
    (tmp_path / "requant").symlink_to(ROOT)  # the clone, named as `git clone` names it
    code = "import requant.convert; print(requant.__version__)"
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: `import requant` found the directory") and "python -P" in last, last
    # the advice works: from another directory, and (Python 3.11+) with -P from the same one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = [([sys.executable, "-c", code], elsewhere)]
    if sys.version_info >= (3, 11):
        runs.append(([sys.executable, "-P", "-c", code], tmp_path))
    for argv, cwd in runs:
        ok = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        assert ok.returncode == 0 and ok.stdout.strip() == __import__("requant").__version__, ok.stderr


def test_convert_help_names_the_embedded_default():
    res = runner.invoke(app, ["convert", "--help"])
    assert res.exit_code == 0
    assert "embedded default" in res.stdout and "tiny" not in res.stdout


def test_generate_engine_fast_on_a_cpu_warns_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after: check_engine sets it on a CPU
    missing = tmp_path / "no-such-checkpoint"  # the run stops at the checkpoint, after the options are checked
    res = runner.invoke(app, ["generate", str(missing), "--prompt", "x", "--engine", "fast", "--device", "cpu"])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and lines[-1].startswith("error:"), res.output
    assert lines[0].startswith("warning: --engine fast on a CPU runs its Triton kernels in the interpreter")


def test_progress_lines_carry_no_source_location():
    res = runner.invoke(app, ["determinism", "--prompts", "1", "--new-tokens", "2"])
    assert res.exit_code == 0, res.output
    assert "native: loading to cpu" in res.stderr  # the phase lines are there
    assert not re.search(r"\b\w+\.py:\d+", res.stderr), res.stderr
