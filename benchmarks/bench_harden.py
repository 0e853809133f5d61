"""Benchmark: what pinning inputs (requant.io.snapshot) costs `convert` and `audit` on a CPU.

Runs the `requant` CLI from two source trees, alternating, each run in its own process:

  before   the tree given by --before (a checkout of the commit before the change)
  after    this tree

on synthetic checkpoints made once under --workdir: `convert --arm nearest` of qwen3-1.7b (~2 GB)
and `audit --backends reference --prompts 1 --phases prefill --no-injection` of qwen3-0.6b. Each
run is timed by the parent (wall seconds, imports included; the page cache warm). Prints, per
command and tree, the median and the spread (min..max) of --repeats runs, and the median change.

    python -m benchmarks.bench_harden --before /path/to/old/tree [--repeats 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tree: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "requant.cli", *args], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/requant-bench-harden"))
    ap.add_argument("--only", choices=["convert", "audit"], default=None)
    a = ap.parse_args()
    from requant.models.synthetic import generate

    a.workdir.mkdir(parents=True, exist_ok=True)
    ckpts = {}
    for preset in ("qwen3-1.7b", "qwen3-0.6b"):
        ckpts[preset] = a.workdir / preset
        if not (ckpts[preset] / "config.json").exists():
            generate(preset, ckpts[preset], seed=0)
    out = a.workdir / "out"
    jobs = {
        "convert": lambda: ["convert", str(ckpts["qwen3-1.7b"]), "-o", str(out), "--arm", "nearest", "--force"],
        "audit": lambda: [
            "audit",
            str(ckpts["qwen3-0.6b"]),
            "--backends",
            "reference",
            "--prompts",
            "1",
            "--phases",
            "prefill",
            "--no-injection",
            "--json",
            str(a.workdir / "audit.json"),
        ],
    }
    trees = {"before": a.before.resolve(), "after": ROOT}
    for name, args in jobs.items():
        if a.only and name != a.only:
            continue
        _run(ROOT, args())  # warm the page cache
        times = {k: [] for k in trees}
        for _ in range(a.repeats):
            for k, tree in trees.items():
                times[k].append(_run(tree, args()))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(f"{name:8s} {k:6s} median {med[k]:8.2f} s  spread {min(v):.2f}..{max(v):.2f} s  n={len(v)}")
        print(f"{name:8s} change of the median: {100 * (med['after'] / med['before'] - 1):+.1f}%")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
