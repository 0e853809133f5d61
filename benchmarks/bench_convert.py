"""Benchmark: `requant convert --arm nearest` against a plain safetensors load-and-save.

Builds a synthetic checkpoint shaped like Qwen3-1.7B (the real config: hidden 2048,
intermediate 6144, 28 layers, 16 heads, 8 KV heads, head_dim 128, vocab 151936, tied
embeddings; 196 quantized Linears; random weights through llm-compressor's RTN
arithmetic; two shards, ~2.0 GB) under a temporary directory, then measures in the same
run, alternating, each in its own subprocess:

  baseline        for every shard: safetensors.torch.load_file + save_file (plus config/index copy)
  baseline_fsync  the same, then fsync of every output file and directory: as durable as
                  convert's output, which fsyncs before and after its atomic rename
  convert   requant.convert.convert(SRC, OUT, "nearest") (validation, requantization of
            every Linear, hashing for the provenance digest, atomic rename)

Each child times its own work (after imports) and reports its peak RSS
(VmHWM from /proc/self/status: ru_maxrss would include the parent's peak, kept across exec) and its RSS after imports. The page cache is warmed
and os.sync() runs before every measured run so that earlier writes do not throttle a
later one. Goals: convert throughput >= 0.5x the baseline's; convert peak RSS < largest
tensor + 1 GB.

    python3 -m benchmarks.bench_convert [--preset qwen3-1.7b] [--repeats 3] [--workdir DIR]

Writes benchmarks/results/convert_<preset>.json (with the command that made it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARD_SIZE = 1_100_000_000  # two shards for Qwen3-1.7B, like the real checkpoint

CHILD_BASELINE = r"""
import json, os, resource, shutil, sys, time
from pathlib import Path
from safetensors.torch import load_file, save_file
def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
def rss_mb(key="VmRSS:"):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
src, out = Path(sys.argv[1]), Path(sys.argv[2])
durable = len(sys.argv) > 3 and sys.argv[3] == "fsync"  # as durable as convert's output
rss0 = rss_mb()
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
out.mkdir()
for p in sorted(src.iterdir()):
    if p.suffix == ".safetensors":
        tensors = load_file(str(p))
        save_file(tensors, str(out / p.name), metadata={"format": "pt"})
        del tensors
    else:
        shutil.copyfile(p, out / p.name)
    if durable:
        fsync_path(out / p.name)
if durable:
    fsync_path(out)
    fsync_path(out.parent)
dt = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "peak_rss_mb": rss_mb("VmHWM:"), "rss_after_import_mb": rss0}))
"""

CHILD_CONVERT = r"""
import json, resource, sys, time
from requant.convert import convert
def rss_mb(key="VmRSS:"):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
rss0 = rss_mb()
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
res = convert(sys.argv[1], sys.argv[2], "nearest")
dt = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
t = res.totals()
print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "peak_rss_mb": rss_mb("VmHWM:"), "rss_after_import_mb": rss0,
                  "scales_changed": t["scales_changed"], "weights_clipped": t["weights_clipped"], "rel_weight_error": t["rel_weight_error"],
                  "linears": t["linears"]}))
"""


def run_child(code: str, *args: str) -> dict:
    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_seconds_with_imports"] = wall
    return out


def warm(path: Path) -> None:
    for p in sorted(path.iterdir()):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-1.7b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--workdir", default=None, help="where to build the checkpoint (default: a temp dir, removed after)"
    )
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args(argv)
    from requant.checkpoint.synthetic import PRESETS, generate, plan

    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="requant-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"{a.preset}-w8a8"
    try:
        t0 = time.perf_counter()
        if not (src / "config.json").exists():
            generate(a.preset, src, seed=0, shard_size=SHARD_SIZE)
        gen_s = time.perf_counter() - t0
        p = PRESETS[a.preset]
        largest = max(math.prod(shape) * (1 if kind == "linear" else 2) for _, kind, shape in plan(p))
        total = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        warm(src)
        runs = {"baseline": [], "baseline_fsync": [], "convert": []}
        load_start = [round(x, 2) for x in os.getloadavg()]
        for i in range(a.repeats):
            for kind, code, extra in (
                ("baseline", CHILD_BASELINE, ()),
                ("baseline_fsync", CHILD_BASELINE, ("fsync",)),
                ("convert", CHILD_CONVERT, ()),
            ):
                out = work / f"out-{kind}"
                shutil.rmtree(out, ignore_errors=True)
                r = run_child(code, str(src), str(out), *extra)
                runs[kind].append(r)
                print(
                    f"[{i + 1}/{a.repeats}] {kind:8s} {r['seconds']:.2f} s  {total / r['seconds'] / 1e9:.2f} GB/s  "
                    f"cpu {r['cpu_seconds']:.2f} s  peak RSS {r['peak_rss_mb']:.0f} MB  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                shutil.rmtree(out, ignore_errors=True)

        def med(xs):
            xs = sorted(xs)
            return xs[len(xs) // 2]

        b_s, c_s = med([r["seconds"] for r in runs["baseline"]]), med([r["seconds"] for r in runs["convert"]])
        bf_s = med([r["seconds"] for r in runs["baseline_fsync"]])
        c_rss = max(r["peak_rss_mb"] for r in runs["convert"])
        b_rss = max(r["peak_rss_mb"] for r in runs["baseline"])
        result = {
            "command": "python3 -m benchmarks.bench_convert " + " ".join(argv if argv is not None else sys.argv[1:]),
            "preset": a.preset,
            "load_average_at_start": load_start,
            "note": (
                "the machine is shared (other jobs run on its 2 cores): convert uses both cores, the baseline "
                "one, so contention hurts convert more; compare the per-run pairs in 'runs'"
            ),
            "machine": {
                "cpus": os.cpu_count(),
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                "platform": platform.platform(),
                "python": platform.python_version(),
                "torch": __import__("torch").__version__,
                "safetensors": __import__("safetensors").__version__,
            },
            "checkpoint": {
                "shards": len(list(src.glob("*.safetensors"))),
                "bytes": total,
                "largest_tensor_bytes": largest,
                "quantized_linears": sum(1 for _, k, _ in plan(p) if k == "linear"),
                "generate_seconds": round(gen_s, 1),
            },
            "baseline_load_save": {
                "median_seconds": round(b_s, 3),
                "best_seconds": round(min(r["seconds"] for r in runs["baseline"]), 3),
                "median_cpu_seconds": round(med([r["cpu_seconds"] for r in runs["baseline"]]), 3),
                "throughput_gb_s": round(total / b_s / 1e9, 3),
                "peak_rss_mb": round(b_rss),
            },
            "convert_nearest": {
                "median_seconds": round(c_s, 3),
                "best_seconds": round(min(r["seconds"] for r in runs["convert"]), 3),
                "median_cpu_seconds": round(med([r["cpu_seconds"] for r in runs["convert"]]), 3),
                "throughput_gb_s": round(total / c_s / 1e9, 3),
                "peak_rss_mb": round(c_rss),
                "rss_after_import_mb": round(max(r["rss_after_import_mb"] for r in runs["convert"])),
                "scales_changed": runs["convert"][0]["scales_changed"],
                "weights_clipped": runs["convert"][0]["weights_clipped"],
                "rel_weight_error": runs["convert"][0]["rel_weight_error"],
            },
            "baseline_load_save_fsync": {
                "median_seconds": round(bf_s, 3),
                "throughput_gb_s": round(total / bf_s / 1e9, 3),
                "note": "the same load + save, then fsync of every output file and directory, as convert does",
            },
            "throughput_ratio_convert_over_baseline": round(b_s / c_s, 3),
            "throughput_ratio_convert_over_durable_baseline": round(bf_s / c_s, 3),
            "goals": {
                "throughput_ratio_at_least_0.5": b_s / c_s >= 0.5,
                "peak_rss_below_largest_tensor_plus_1GB": c_rss * 2**20 < largest + 2**30,
                "memory_limit_mb": round((largest + 2**30) / 2**20),
            },
            "runs": runs,
        }
        Path(a.results).mkdir(parents=True, exist_ok=True)
        dest = Path(a.results) / f"convert_{a.preset}.json"
        dest.write_text(json.dumps(result, indent=2) + "\n")
        print(
            json.dumps(
                {
                    k: result[k]
                    for k in (
                        "baseline_load_save",
                        "baseline_load_save_fsync",
                        "convert_nearest",
                        "throughput_ratio_convert_over_baseline",
                        "throughput_ratio_convert_over_durable_baseline",
                        "goals",
                    )
                },
                indent=2,
            )
        )
        print(f"wrote {dest}")
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
