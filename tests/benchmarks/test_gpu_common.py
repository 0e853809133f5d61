"""benchmarks/_gpu_common.sh, the helper every GPU script sources, run by bash on the CPU with
stand-in commands (true, false, sleep): the exit status, wall time and output each step
records, the time limit, skipped steps, $OUT resolution, and that every GPU script uses it.
Independent references: the exit statuses of the stand-ins (true 0, false 1, timeout's 124)
and the files written by hand here."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "benchmarks" / "_gpu_common.sh"
LINE = re.compile(r"^== (\S+) +(\d+)\.(\d{3}) s  rc=(\d+)  \(t=\d+ s\)$")


def _bash(script: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    full = f'set -uo pipefail\nsource "{HELPER}" || exit 9\n{script}'
    return subprocess.run(
        ["bash", "-c", full],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "REQUANT_COMMIT": "0123abc", **env},
    )


def test_steps_record_status_time_and_output(tmp_path):
    r = _bash(
        """gpu_out
TIMINGS="$OUT/timings.txt"
STEP_LOG="$OUT/all.log"
step ok 0 echo hello
echo "rc=$RC"
step fails 0 false
echo "rc=$RC"
step slow 1 sleep 5
echo "rc=$RC"
skip later "no time left"
echo "rc=$RC pwd=$PWD commit=$REQUANT_COMMIT"
STEPS="build tests" && has tests && ! has bench && echo has-ok
""",
        tmp_path,
        OUT="out",  # relative: the caller's directory, not the repository root the helper moves to
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    lines = (out / "timings.txt").read_text().splitlines()
    parsed = [LINE.match(x) for x in lines[:3]]
    assert [(m.group(1), int(m.group(4))) for m in parsed] == [("ok", 0), ("fails", 1), ("slow", 124)]
    assert 1 <= int(parsed[2].group(2)) < 5  # stopped by its 1 s limit, not after the 5 s sleep
    assert lines[3].startswith("== later") and "skipped: no time left" in lines[3]
    assert "rc=0\n" in r.stdout and "rc=1\n" in r.stdout and "rc=124\n" in r.stdout
    assert f"rc=125 pwd={ROOT} commit=0123abc" in r.stdout and "has-ok" in r.stdout
    log = (out / "all.log").read_text()
    assert "=== ok (limit 0 s) ===\nhello\n" in log and log.count("\n== ") == 4


def test_step_dir_gets_one_log_per_step(tmp_path):
    r = _bash(
        'gpu_out\nSTEP_DIR="$OUT"\nstep first 0 echo one\nstep second 0 echo two', tmp_path, OUT=str(tmp_path / "o")
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "first.log").read_text() == "one\n"
    assert (tmp_path / "o" / "second.log").read_text() == "two\n"


def test_out_is_required_unless_a_default_is_given(tmp_path):
    r = _bash("gpu_out\necho unreachable", tmp_path)
    assert r.returncode != 0 and "set OUT to the results directory" in r.stderr and "unreachable" not in r.stdout
    r = _bash('gpu_out "$HOME/d"\necho "$OUT"', tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "d") and (tmp_path / "d").is_dir()


def test_every_gpu_script_sources_the_helper():
    scripts = sorted(p for p in (ROOT / "benchmarks").glob("gpu_*.sh") if p.name != "gpu_setup.sh")
    index = (ROOT / "benchmarks" / "README.md").read_text()
    assert scripts and all(f"`{p.name}`" in index for p in scripts)  # each one indexed by what it measures
    for p in scripts:
        text = p.read_text()
        assert 'source "$(dirname "$0")/_gpu_common.sh" || exit 1' in text, p.name
        assert not re.search(r"^\s*(step|now|has|left|budget|ckpt|generate)\(\)", text, re.M), (
            f"{p.name} defines its own helper"
        )
        assert "gpu_env" in text, p.name


def test_synthetic_checkpoints_lists_the_ones_that_exist(tmp_path):
    """Without "generate" in STEPS nothing is made: CKPTS holds the sizes whose config.json exists."""
    (tmp_path / "requant-a-synthetic").mkdir()
    (tmp_path / "requant-a-synthetic" / "config.json").write_text("{}")
    (tmp_path / "requant-b-synthetic").mkdir()  # no config.json: an unfinished one
    r = _bash('SIZES="a b c" STEPS=tests synthetic_checkpoints\necho "${CKPTS[*]}"', tmp_path, CKPT_ROOT=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "requant-a-synthetic")


def test_qwen3_synthetic_makes_a_missing_checkpoint_when_asked_and_time_is_left(tmp_path):
    """qwen3_ckpt names $CKPT_ROOT/requant-qwen3-SIZE-synthetic; qwen3_synthetic runs the generator
    (a stand-in python3 on PATH that records its arguments) only for a missing checkpoint, only with
    "generate" in STEPS, and with EST_S only when budget leaves that much of TOTAL_S (else a skip
    line). Reference: the stand-in's record and the timings lines written here."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text('#!/bin/sh\necho "$@" >> "$CKPT_ROOT/calls"\n')
    (bin_ / "python3").chmod(0o755)
    (tmp_path / "requant-qwen3-old-synthetic").mkdir()
    (tmp_path / "requant-qwen3-old-synthetic" / "config.json").write_text("{}")
    r = _bash(
        """TIMINGS="$CKPT_ROOT/t"; TOTAL_S=100
echo "$(qwen3_ckpt 8b)"
STEPS=tests qwen3_synthetic a 5
STEPS=generate qwen3_synthetic old 5
STEPS=generate qwen3_synthetic b 5
STEPS=generate qwen3_synthetic c 5 10
STEPS=generate qwen3_synthetic d 5 1000
budget e 1 && echo e-ok
budget f 101 || echo f-skipped""",
        tmp_path,
        CKPT_ROOT=str(tmp_path),
        PATH=f"{bin_}:/usr/bin:/bin",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(tmp_path / "requant-qwen3-8b-synthetic")
    assert "e-ok" in r.stdout and "f-skipped" in r.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    tail = "--device cuda --shard-size 4000000000"
    assert calls == [
        f"-m requant.checkpoint.synthetic qwen3-{s} {tmp_path}/requant-qwen3-{s}-synthetic {tail}" for s in "bc"
    ]
    lines = (tmp_path / "t").read_text().splitlines()
    assert [x.split()[1] for x in lines] == ["synthetic_b", "synthetic_c", "synthetic_d", "f"]
    assert "skipped: " in lines[2] and "needs ~1000 s" in lines[2] and "needs ~101 s" in lines[3]


def test_the_reverse_order_plugin_reverses_the_collected_tests(tmp_path):
    """gpu_suite.sh's reversed pass: the same tests, the order of a plain run reversed. Reference:
    pytest's own collection without the plugin."""
    (tmp_path / "test_x.py").write_text("def test_a(): pass\n\ndef test_b(): pass\n\ndef test_c(): pass\n")

    def collected(*extra):
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, "test_x.py"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return [line for line in r.stdout.splitlines() if "::" in line]

    plain = collected()
    assert [t.split("::")[1] for t in plain] == ["test_a", "test_b", "test_c"]
    assert collected("-p", "benchmarks._reverse_order") == plain[::-1]
