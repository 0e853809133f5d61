"""The README's promises, checked for every command of the assembled app (requant.cli.app):

  (a) a checkpoint that is not Qwen3 (a tiny requant.checkpoint.synthetic checkpoint whose config.json says
      LlamaForCausalLM) is refused before any work: exit 2, one stderr line naming the file and
      the field, nothing written;
  (b) a usage error is one `error: ...` line and exit 2, no boxed panel;
  (c) SIGTERM once the command is under way (a subprocess that blocks inside the command's own
      work, see BLOCK) exits 130 with the interrupt line and leaves nothing behind in tmp_path
      (temporary directories included: TMPDIR points into tmp_path).

The independent reference is the README's "Commands and exit codes" section: the expected codes
and line shapes are written out here, not taken from requant.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint.synthetic import generate
from requant.cli import app

runner = CliRunner()
ARCH_LINE = (
    'config.json: architectures is ["LlamaForCausalLM"]; requant supports Qwen3ForCausalLM or Qwen3MoeForCausalLM only'
)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(Path(root).rglob("*"))}


def _llama(d: Path) -> Path:
    """A tiny synthetic checkpoint re-labelled as a Llama (no SHA256SUMS, so that nothing else is wrong)."""
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["LlamaForCausalLM"], "llama"
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("SHA256SUMS", "SHA256SUMS.source"):
        (d / f).unlink(missing_ok=True)
    return d


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    base = tmp_path_factory.mktemp("llama")
    generate("tiny", base / "w8a8", keep_source=base / "bf16")
    return _llama(base / "w8a8"), _llama(base / "bf16")


NON_QWEN3 = {  # every command that reads a checkpoint's config.json
    "convert": lambda c, o: ["convert", c, "-o", o / "out"],
    "inspect": lambda c, o: ["inspect", c],
    "audit": lambda c, o: ["audit", c, "--backends", "reference", "--json", o / "a.json"],
    "audit --plan": lambda c, o: ["audit", c, "--plan"],
    "determinism": lambda c, o: ["determinism", c, "--backends", "reference", "--json", o / "d.json"],
    "eval": lambda c, o: ["eval", c, "--limit", "1", "--json", o / "e.json"],
    "tp-check": lambda c, o: ["tp-check", c, "--tp", "1,2", "--json", o / "t.json"],
    "card": lambda c, o: ["card", c],
    "push --dry-run": lambda c, o: ["push", c, "me/model", "--dry-run"],
}


@pytest.mark.parametrize("case", list(NON_QWEN3))
def test_non_qwen3_checkpoint_is_refused(case, llama, tmp_path):
    ckpt, _ = llama
    before = _tree(ckpt)
    res = runner.invoke(app, [str(a) for a in NON_QWEN3[case](ckpt, tmp_path)])
    assert res.exit_code == 2, (case, res.output)
    assert res.stderr.splitlines() == [f"error: {ckpt}/{ARCH_LINE}"], (case, res.stderr)
    assert _tree(ckpt) == before and list(tmp_path.iterdir()) == []  # nothing written, nowhere


def test_non_qwen3_bf16_source_is_refused_by_eval(llama, tmp_path):
    _, bf16 = llama
    res = runner.invoke(app, ["eval", str(DEFAULT_CHECKPOINT), "--source", str(bf16), "--limit", "1"])
    assert res.exit_code == 2 and res.stderr.splitlines() == [f"error: {bf16}/{ARCH_LINE}"], res.stderr


def test_non_qwen3_model_type_alone_is_refused(llama, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(llama[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]  # the architecture right, the model type not
    (d / "config.json").write_text(json.dumps(cfg))
    res = runner.invoke(app, ["inspect", str(d)])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"error: {d}/config.json: model_type is \"llama\"; requant supports 'qwen3' (Qwen3ForCausalLM) only"
    ], res.stderr


def test_byte_level_commands_accept_any_directory(llama, tmp_path):
    """verify and manifest compare and hash bytes; neither reads a config (README: verify needs no
    valid checkpoint), so a non-Qwen3 directory is theirs to check."""
    ckpt, _ = llama
    assert runner.invoke(app, ["verify", str(ckpt), str(ckpt)]).exit_code == 0
    assert runner.invoke(app, ["manifest", str(ckpt)]).exit_code == 0


USAGE = {  # (argv, what the one line says)
    "convert --arm nearst": (["convert", "-o", "x", "--arm", "nearst"], "'nearst' is not one of"),
    "audit --jsn": (["audit", "--jsn", "x"], "No such option: --jsn"),
    "conform --backendz": (["conform", "--backendz"], "No such option: --backendz"),
    "verify, no argument": (["verify"], "Missing argument 'A'"),
    "convert, no -o": (["convert"], "Missing option '-o' / '--output'"),
    "push, one argument": (["push", "x"], "Missing argument 'REPO_ID'"),
    "inspect --jobs": (["inspect", "x", "--jobs", "2"], "No such option: --jobs"),
    "determinism --prompts x": (["determinism", "--prompts", "x"], "Invalid value for '--prompts'"),
    "eval --limit x": (["eval", "--limit", "x"], "Invalid value for '--limit'"),
    "tp-check --tpp": (["tp-check", "--tpp", "2"], "No such option: --tpp"),
    "manifest --wirte": (["manifest", "x", "--wirte"], "No such option: --wirte"),
    "card --stdot": (["card", "x", "--stdot"], "No such option: --stdot"),
    "no such command": (["convrt"], "No such command 'convrt'"),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_usage_error_is_one_line(case, tmp_path):
    argv, says = USAGE[case]
    res = runner.invoke(app, argv)
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.stderr
    assert "╭" not in res.stderr and "Usage:" not in res.stderr and res.stdout == ""


def test_usage_error_keeps_the_did_you_mean_hint():
    res = runner.invoke(app, ["audit", "--jsn", "x"])
    assert res.stderr.splitlines() == ["error: No such option: --jsn (did you mean --json?) (see requant audit --help)"]


# -- SIGTERM -------------------------------------------------------------------------------
# The subprocess wraps one function the command calls while it works (module:function:nth call);
# after that call returns it touches MARKER and sleeps, so that SIGTERM lands inside the work.
BLOCK = r"""
import importlib, os, sys, time
mod, fn, nth = os.environ["BLOCK_AT"].rsplit(":", 2)
m = importlib.import_module(mod)
real, calls = getattr(m, fn), [0]
def blocked(*a, **k):
    r = real(*a, **k)
    calls[0] += 1
    if calls[0] == int(nth):
        open(os.environ["MARKER"], "w").close()
        time.sleep(120)
    return r
setattr(m, fn, blocked)
from requant.cli import app
app(sys.argv[1:], prog_name="requant")
"""

SIGTERM = {  # case: (block at, argv(ckpt copy, out dir))
    "convert": ("requant.convert._streaming:copy_other_files:1", lambda c, o: ["convert", c, "-o", o / "pow2"]),
    "inspect": ("requant.checkpoint:open_checkpoint:1", lambda c, o: ["inspect", c]),
    "verify": ("requant.evidence.manifest:walk_files:1", lambda c, o: ["verify", c, c]),
    "audit": (
        "requant.checkpoint:open_checkpoint:1",
        lambda c, o: ["audit", c, "--backends", "reference", "--prompts", "1", "--json", o / "a.json"],
    ),
    "determinism": (
        "requant.checkpoint:open_checkpoint:1",
        lambda c, o: ["determinism", c, "--backends", "reference", "--prompts", "1", "--json", o / "d.json"],
    ),
    # after the nearest arm was converted into /tmp/requant-eval-*/nearest: that directory must go too
    "eval": (
        "requant.convert:convert:1",
        lambda c, o: ["eval", c, "--arms", "nearest", "--limit", "1", "--json", o / "e.json"],
    ),
    "conform": (
        "requant.audit.conform:run_cases:1",
        lambda c, o: ["conform", "--backend", "reference", "--json", o / "c.json"],
    ),
    "tp-check": (
        "requant.checkpoint:open_checkpoint:1",
        lambda c, o: ["tp-check", c, "--tp", "2", "--json", o / "t.json"],
    ),
    "manifest --write": ("requant.evidence.manifest:compute:1", lambda c, o: ["manifest", c, "--write"]),
    "card": ("requant.checkpoint:open_checkpoint:1", lambda c, o: ["card", c]),
    "push --dry-run": ("requant.checkpoint:open_checkpoint:1", lambda c, o: ["push", c, "me/model", "--dry-run"]),
}


@pytest.mark.parametrize("case", list(SIGTERM))
def test_sigterm_exits_130_and_leaves_nothing(case, tmp_path, tmp_path_factory):
    block_at, argv = SIGTERM[case]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, ckpt)
    if case == "manifest --write":
        (ckpt / "SHA256SUMS").unlink(missing_ok=True)
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    before = _tree(tmp_path)
    marker = tmp_path_factory.mktemp("marker") / "started"
    env = dict(os.environ, BLOCK_AT=block_at, MARKER=str(marker), TMPDIR=str(tmp_path / "tmp"), COLUMNS="200")
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCK, *[str(a) for a in argv(ckpt, out)]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), (case, proc.poll(), proc.communicate()[1] if proc.poll() is not None else "")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (case, proc.returncode, stderr)
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert errors == [stderr.splitlines()[-1]] and "interrupted" in errors[0], (case, stderr)
    assert "Traceback" not in stderr
    assert _tree(tmp_path) == before, case  # nothing written, no temporary left (TMPDIR included)
