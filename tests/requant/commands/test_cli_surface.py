"""What a user sees of the assembled app (requant.cli.app) outside the work itself: the error for a
mistyped path, Triton's interpreter on a CPU, tables at 80 columns, the help text, the echoed
command line, REQUANT_DEBUG, convert's README stub, the commands' index. Each expectation is
written out here (the README's and the help's own words), not read from requant."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import requant.commands as commands_pkg
from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from requant.scales import ARMS

runner = CliRunner()


# -- a mistyped local path ------------------------------------------------------------------
def test_mistyped_local_path_offline_says_no_such_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "pow2").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(app, ["inspect", "out/pwo2"])
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert lines[0] == (
        "error: out/pwo2: no such directory on this machine, and the Hub repo out/pwo2 is not in the local "
        "cache either (HF_HUB_OFFLINE is set)"
    )
    assert "\\n" not in lines[0] and "Error" not in lines[0]  # no literal \n, no exception class name


def test_mistyped_local_path_not_on_the_hub_either(tmp_path, monkeypatch, hub):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["inspect", "out/pwo2"])
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: out/pwo2: no such directory on this machine, and no Hub repo out/pwo2")
    assert "Error" not in lines[0]


def test_mistyped_path_that_is_no_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["inspect", "./pwo2"])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == ["error: ./pwo2: no such directory, and not a Hub repo id (org/name)"]


# -- Triton on a CPU ------------------------------------------------------------------------
def test_triton_backend_on_cpu_turns_the_interpreter_on():
    """A fresh process (Triton not yet imported), no TRITON_INTERPRET: asking for a triton backend
    on the CPU sets it before Triton is imported; an explicit 0 is kept (the command then refuses)."""
    code = (
        "import os, sys\n"
        "from requant.backends import check_runnable\n"
        "check_runnable(('triton', 'reference'), 'cpu', 'reference')\n"
        "assert os.environ['TRITON_INTERPRET'] == '1' and 'triton' not in sys.modules\n"
        "import triton  # reads the variable now\n"
        "from requant.kernels.triton import _launch\n"
        "assert _launch.INTERPRET\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    keep = "from requant.backends import triton_interpreter_on_cpu as t; assert t('cpu') is False"
    res = subprocess.run([sys.executable, "-c", keep], env=dict(env, TRITON_INTERPRET="0"), capture_output=True)
    assert res.returncode == 0, res.stderr


# -- narrow terminals -----------------------------------------------------------------------
def test_convert_table_at_80_columns_keeps_linear_names_distinct(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert any(ln.startswith(f"layers.0.self_attn.{proj} ") for ln in lines), proj
    table = lines[: next(i for i, ln in enumerate(lines) if "quantized Linears" in ln)]
    assert max(len(ln) for ln in table) <= 80 and "…" not in res.stdout and "..." not in res.stdout


def test_piped_output_is_not_forced_to_200_columns(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    res = runner.invoke(app, ["convert", "-o", str(tmp_path / "p")])
    table = res.stdout.split("quantized Linears")[0].splitlines()
    assert res.exit_code == 0 and max(len(ln) for ln in table) <= 80  # rich's default for a pipe


def test_inspect_lines_have_no_trailing_spaces():
    res = runner.invoke(app, ["inspect", str(DEFAULT_CHECKPOINT)])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert all(ln == ln.rstrip() for ln in lines) and any("Qwen3ForCausalLM (qwen3)" in ln for ln in lines)
    assert any(re.match(r"^\s+shape\s+hidden_size=256, ", ln) for ln in lines)  # the long value on one line


# -- help text ------------------------------------------------------------------------------
COMMANDS = [
    "convert",
    "inspect",
    "verify",
    "audit",
    "conform",
    "determinism",
    "eval",
    "manifest",
    "card",
    "push",
    "generate",
    "replay",
]


def _option_values() -> dict[str, set[str]]:
    """{option: the values it takes, as the user types them}: the runtime's, scales', tensor
    parallelism's and kernels' names, the audit's phases and matrices, tp-check's collectives."""
    from requant import kernels
    from requant.runtime.model import ENGINES
    from requant.runtime.weights import REGIMES
    from requant.tp.engine import REDUCES

    mm, act = set(kernels.scaled_mm_backends()), set(kernels.quantize_backends())
    return {
        "--arm": set(ARMS),
        "--arms": {"native", *ARMS},
        "--engine": set(ENGINES),
        "--regime": set(REGIMES),
        "--reduce": set(REDUCES),
        "--phases": {"prefill", "decode"},
        "--matrix": {"v1", "v2", "v3", "v4"},
        "--comm": {"auto", "gloo", "nccl"},
        "--backend": mm,
        "--backends": mm | {"reference"},
        "--act-backend": act,
    }


def _option_helps(command) -> list[tuple[str, str]]:
    """(flag, whole help text) of every option and argument of `command` (None: the app's own)."""
    res = runner.invoke(app, [command, "--help"] if command else ["--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0 and "<bool>" not in res.stdout and "╭" not in res.stdout
    text = res.stdout.split("Arguments:", 1)[-1] if "Arguments:" in res.stdout else res.stdout
    parts = re.split(r"^  (?:-\w, )?((?:--)?[\w-]+)(?: / --[\w-]+)?(?: <[^>]+>)?\s{2,}", text, flags=re.M)[1:]
    return [(flag, " ".join(h.split())) for flag, h in zip(parts[::2], parts[1::2])]


@pytest.mark.parametrize("command", [None, *COMMANDS, "tp-check"])
def test_help_has_no_bool_metavar_and_consistent_capitals(command):
    # a help starts with a capital, or with one of its option's values as typed ("native (...) or pow2")
    values = _option_values()
    helps = _option_helps(command)
    assert helps, command
    for flag, h in helps:
        assert h[0].isupper() or re.split(r"[ ,.:;(]", h)[0] in values.get(flag, ()), (flag, h)


@pytest.mark.parametrize("command", COMMANDS + ["tp-check"])
def test_no_help_text_capitalises_an_option_value(command):
    # an option's value ("native", "auto", "prefill") is spelled as it is typed, at the start of its help as anywhere else in it
    values = _option_values()
    for flag, h in _option_helps(command):
        words = re.findall(r"[\w-]+", h)
        capitalised = [w for w in words if w != w.lower() and w.lower() in values.get(flag, ())]
        assert not capitalised, (command, flag, capitalised, h)


@pytest.mark.parametrize("command", COMMANDS + ["tp-check"])
def test_every_argument_is_shown_in_upper_case(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    usage = res.stdout.splitlines()[0]
    args = re.findall(r"[{\[]([^\]}]+)[}\]]", usage.split("[OPTIONS]", 1)[1])
    assert all(a == a.upper() for a in args), usage
    listed = re.findall(r"^  ([\w-]+) <", res.stdout.split("Options:")[0], flags=re.M)
    assert all(a == a.upper() for a in listed), listed


def test_every_engine_synopsis_lists_every_engine():
    # docs/runtime.md's synopses and each command's own (its module docstring) name every engine
    # of ENGINES wherever they show --engine
    import importlib

    from requant.runtime.model import ENGINES

    every = "|".join(ENGINES)
    docs = (Path(__file__).parents[3] / "docs" / "runtime.md").read_text()
    listed = re.findall(r"--engine ((?:[a-z]+\|)+[a-z]+)", docs)
    assert listed and set(listed) == {every}, listed
    synopsis = docs.split("requant determinism [CKPT]", 1)[1].split("```", 1)[0]
    assert f"--engine {every}" in synopsis
    group = typer.main.get_command(app)
    modules = {"determinism": "determinism", "eval": "evaluate", "generate": "generate", "replay": "replay"}
    with_engine = sorted(n for n, c in group.commands.items() if any("--engine" in p.opts for p in c.params))
    assert with_engine == sorted(modules)
    for name in with_engine:
        doc = importlib.import_module(f"requant.commands.{modules[name]}").__doc__
        assert f"--engine {every}" in doc, name


def test_replay_help_shows_RECORD_and_its_json_writes_the_comparison_report():
    res = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "100"})
    text = " ".join(res.stdout.split())
    assert res.stdout.splitlines()[0] == "Usage: requant replay [OPTIONS] {RECORD}"
    assert "RECORD <path>" in text and "{record}" not in text
    assert "--json <path> Write the comparison report" in text


def test_command_summaries_are_whole_sentences():
    res = runner.invoke(app, ["--help"], env={"COLUMNS": "80"})
    listing = res.stdout.split("Commands:", 1)[1].strip().splitlines()
    assert len(listing) == 13
    for line in listing:
        assert line.rstrip().endswith(".") and "..." not in line, line


def test_arm_help_lists_every_arm():
    res = runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "80"})
    text = " ".join(res.stdout.split())
    assert f"<{'|'.join(ARMS)}>" in text or all(a in text.split("--arm", 1)[1].split("--json")[0] for a in ARMS)
    assert all(a in text.split("Scale arm:", 1)[1].split("--json")[0] for a in ARMS)


def test_push_dry_run_columns_are_named(audited_pow2, hub, tmp_path):
    res = runner.invoke(app, ["push", str(audited_pow2), "me/model", "--dry-run"])
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[1].split()
    assert header == ["file", "bytes", "sha256", "note"]
    assert not hub.requests


# -- the echoed command line, REQUANT_DEBUG -------------------------------------------------
def test_echoed_command_line_follows_the_parsed_parameters(tmp_path):
    out = tmp_path / "c.json"
    res = runner.invoke(app, ["conform", "--json", str(out), "--backend", "reference"])
    assert res.exit_code == 0, res.output
    # declaration order (--backend before --json), only what was given
    assert json.loads(out.read_text())["command"] == f"requant conform --backend reference --json {out}"


def test_echoed_command_line_adds_the_resolved_backend_pair(tmp_path):
    out = tmp_path / "d.json"
    res = runner.invoke(app, ["determinism", "--prompts", "1", "--new-tokens", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["command"] == (
        f"requant determinism --prompts 1 --new-tokens 1 --json {out} --backends reference"
    )


def test_requant_debug_shows_the_traceback(tmp_path):
    plain = runner.invoke(app, ["inspect", str(tmp_path / "nope")])
    debug = runner.invoke(app, ["inspect", str(tmp_path / "nope")], env={"REQUANT_DEBUG": "1"})
    assert plain.exit_code == debug.exit_code == 2 and "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr and "LayoutError" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]  # the same error line, last


# -- convert and the source's README --------------------------------------------------------
def test_convert_replaces_the_source_readme_with_a_stub(tmp_path):
    src = (DEFAULT_CHECKPOINT / "README.md").read_text()
    front = src[: src.index("\n---", 3) + 5]
    assert runner.invoke(app, ["convert", "-o", str(tmp_path / "p")]).exit_code == 0
    stub = (tmp_path / "p" / "README.md").read_text()
    assert stub.startswith(front) and "requant card" in stub and src[len(front) :].strip() not in stub
    assert runner.invoke(app, ["manifest", str(tmp_path / "p")]).exit_code == 0  # listed as written
    assert runner.invoke(app, ["convert", "-o", str(tmp_path / "u"), "--arm", "unconstrained"]).exit_code == 0
    assert (tmp_path / "u" / "README.md").read_text() == src  # the round trip stays byte for byte


# -- the commands' index --------------------------------------------------------------------
def test_commands_index_lists_every_module():
    pkg = Path(commands_pkg.__file__).parent
    modules = sorted(p.name for p in pkg.glob("*.py") if p.name != "__init__.py")
    assert "eval.py" not in modules  # would shadow the builtin when imported as `eval`
    for m in modules:
        assert m in commands_pkg.__doc__, m
