"""Benchmark: what pinning inputs (requant.io.snapshot) costs `convert` and `audit` on a CPU.

Runs the `requant` CLI from two source trees, alternating, each run in its own process:

  before   the tree given by --before (a checkout of the commit before the change)
  after    this tree

on synthetic checkpoints made once under --workdir: `convert --arm nearest` of qwen3-1.7b (~2 GB)
and `audit --backends reference --prompts 1 --phases prefill --no-injection` of qwen3-0.6b. Each
run is timed by the parent: wall seconds and the child's CPU seconds (user + system; less moved by
other load on a shared machine), imports included, the page cache warm. Prints, per command and
tree, the median and the spread (min..max) of --repeats runs, and the change of the medians.

    python -m benchmarks.bench_harden --before /path/to/old/tree [--repeats 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child: user + system) of one `requant ARGS` run from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "requant.cli", *args], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/requant-bench-harden"))
    ap.add_argument("--only", choices=["convert", "audit"], default=None)
    a = ap.parse_args()
    from requant.checkpoint.synthetic import generate

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
            "--byte-tokens",
            "--json",
            str(a.workdir / "audit.json"),
        ],
    }
    trees = {"before": a.before.resolve(), "after": ROOT}
    for name, args in jobs.items():
        if a.only and name != a.only:
            continue
        _run(ROOT, args())  # warm the page cache
        runs = {k: [] for k in trees}
        for _ in range(a.repeats):
            for k, tree in trees.items():
                runs[k].append(_run(tree, args()))
        for i, what in enumerate(("wall", "cpu")):
            med = {k: statistics.median(r[i] for r in v) for k, v in runs.items()}
            for k, v in runs.items():
                xs = [r[i] for r in v]
                print(
                    f"{name:8s} {what:4s} {k:6s} median {med[k]:8.2f} s  spread {min(xs):.2f}..{max(xs):.2f} s  n={len(xs)}"
                )
            print(
                f"{name:8s} {what:4s} change of the median: {100 * (med['after'] / med['before'] - 1):+.1f}%",
                flush=True,
            )
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
