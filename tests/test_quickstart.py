"""The README's Quickstart, line by line, on a CPU: every `requant ...` line of its code block
parsed from README.md and run as written (in a fresh directory, so `out/...` is relative to it),
with only the placeholders replaced:

  org/Qwen3-8B-W8A8, SRC   a tiny requant.checkpoint.synthetic checkpoint (no Qwen3 weights, no network)
  OUT                      out/roundtrip;  A B: that synthetic and out/roundtrip
  requant/data/default     the embedded default's installed path (the worked example's clone path)
  me/model-pow2            kept: a repo id pushed to tests/hubserver.py's loopback fake Hub

and a few options added to keep the whole file near a minute on a 2-core CPU (EXTRA: each says
why). The independent reference is the README itself: every line's comment promises exit 0 (verify's
"exit 0 iff every file is byte-identical", the round trip's "exit 0", push's refusal only without a
clean audit of these bytes, which the audit line above it provides).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint.synthetic import generate
from requant.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"
runner = CliRunner()

# Added to keep the run short; none changes what the line checks.
EXTRA = {
    "audit": ["--prompts", "1"],  # 1 calibration prompt instead of 8: the same cells, 8x less prefill
    "determinism": ["--prompts", "1", "--new-tokens", "4"],  # 1 prompt, 4 tokens: still both kernels, both regimes
    "eval": ["--limit", "1", "--arms", "native,nearest"],  # 1 document, the arm out/pow2 holds (nearest)
    "tp-check": ["--prompts", "1", "--new-tokens", "2"],  # 1 prompt, 2 tokens, each TP degree still run
}


def quickstart_lines() -> list[str]:
    text = README.read_text()
    block = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = []
    for raw in block.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if line.startswith("requant "):
            lines += [part.strip() for part in line.split("&&")]
    return lines


def _argv(line: str, synthetic: Path) -> list[str]:
    words = shlex.split(line)[1:]
    subs = {
        "org/Qwen3-8B-W8A8": str(synthetic),
        "SRC": str(synthetic),
        "OUT": "out/roundtrip",
        "A": str(synthetic),
        "requant/data/default": str(DEFAULT_CHECKPOINT),
    }
    if words[0] == "verify" and words[1:] == ["A", "B"]:
        return ["verify", str(synthetic), "out/roundtrip"]
    return [subs.get(w, w) for w in words] + EXTRA.get(words[0], [])


def test_the_readme_quickstart_lines_are_all_found():
    lines = quickstart_lines()
    commands = [shlex.split(line)[1] for line in lines]
    for c in ("convert", "inspect", "verify", "audit", "determinism", "eval", "conform", "tp-check", "manifest"):
        assert c in commands, c
    assert commands[-3:] == ["card", "push", "push"] and len(lines) >= 15


def test_quickstart_runs_on_a_cpu_as_written(tmp_path, monkeypatch, hub):
    synthetic = generate("tiny", tmp_path / "synthetic")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for line in quickstart_lines():
        argv = _argv(line, synthetic)
        if argv[0] == "conform":  # a fresh process, as a user runs it: Triton is imported there for the first time
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            code = "import sys; from requant.cli import app; sys.argv[0] = 'requant'; app(sys.argv[1:], prog_name='requant')"
            res = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
            assert res.returncode == 0, (line, res.stderr)
            continue
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, (line, argv, res.output)
    card = (work / "out" / "pow2" / "README.md").read_text()
    perplexity = card.split("## Perplexity", 1)[1].split("\n## ", 1)[0]
    assert "Not measured" not in perplexity and "**nearest** (this checkpoint)" in perplexity
    assert (work / "out" / "triton.json").is_file() and (work / "out" / "8b.json").is_file()
    assert hub.requests  # the last line did push, to the loopback Hub


def _setup_block() -> list[str]:
    block = README.read_text().split("```bash", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.strip().splitlines()]


def test_the_readme_set_up_is_two_commands_and_ci_runs_them():
    """The README's set-up: one command installs and runs the main job on the embedded default, one
    runs the tests; .ci/run (in a fresh venv) runs the same install, the main job and the test command."""
    install, tests = _setup_block()
    assert (
        install
        == "python3 -m pip install torch==2.13.0 -e '.[test]' && requant convert -o out/pow2 && requant audit out/pow2"
    )
    assert tests == "python3 -m pytest -q tests"
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and "torch==2.13.0 -e '.[test]'" in ci
    assert "requant convert -o out/pow2 && requant audit out/pow2" in ci
    assert ci.rstrip().splitlines()[-1] == tests


def test_the_readme_main_job_runs_in_a_fresh_directory(tmp_path, monkeypatch):
    """The set-up command's main job, as written (after the install), from an empty directory: both exit 0."""
    monkeypatch.chdir(tmp_path)
    for part in _setup_block()[0].split("&&")[1:]:
        res = runner.invoke(app, shlex.split(part)[1:])
        assert res.exit_code == 0, (part, res.output)
    assert "pow2: 42/42 layers bitwise equal" in res.output
