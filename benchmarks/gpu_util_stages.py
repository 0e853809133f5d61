"""The GPU's utilization per stage of an audit (benchmarks/gpu_profile_audit.sh, PROFILER=util).

    python -m benchmarks.gpu_util_stages util.csv audit.log

util.csv: `nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits
-lms 100` (a sample's utilization is the share of its period in which a kernel ran). audit.log: the
audit's progress lines, `[HH:MM:SS] stage` (rich's clock, whole seconds). Each stage runs from its line
to the next one's; the last to the last sample (so it holds the JSON and the report). Prints one
Markdown row per stage: seconds, samples, mean and median utilization; a stage far below 100% is the
host's time (dispatch, Python), not the GPU's.
"""

from __future__ import annotations

import argparse
import re
import statistics
from datetime import datetime, timedelta

STAGE = re.compile(r"^\[(\d\d):(\d\d):(\d\d)\] (.+?)\s*$")


def read_samples(text: str) -> list[tuple[datetime, float]]:
    """(time, utilization %) per line of nvidia-smi's CSV; lines that are not samples are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            out.append((datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1])))
        except ValueError:
            continue
    return out


def read_stages(text: str, day: datetime) -> list[tuple[datetime, str]]:
    """(start, name) of each `[HH:MM:SS] name` line, on the samples' day (a stage past midnight is
    moved to the next day)."""
    out: list[tuple[datetime, str]] = []
    for line in text.splitlines():
        m = STAGE.match(line)
        if not m:
            continue
        h, mi, s, name = int(m[1]), int(m[2]), int(m[3]), m[4]
        t = day.replace(hour=h, minute=mi, second=s, microsecond=0)
        while out and t < out[-1][0]:
            t += timedelta(days=1)
        out.append((t, name))
    return out


def per_stage(samples, stages) -> list[dict]:
    rows = []
    if not samples or not stages:
        return rows
    end = samples[-1][0]
    for i, (start, name) in enumerate(stages):
        stop = stages[i + 1][0] if i + 1 < len(stages) else end + timedelta(microseconds=1)
        util = [u for t, u in samples if start <= t < stop]
        rows.append(
            {
                "stage": name,
                "seconds": round((min(stop, end) - start).total_seconds(), 1),
                "samples": len(util),
                "mean_util": round(statistics.fmean(util), 1) if util else None,
                "median_util": statistics.median(util) if util else None,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| stage | s | samples | mean GPU utilization % | median |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['seconds']} | {r['samples']} | {r['mean_util']} | {r['median_util']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("util_csv")
    ap.add_argument("audit_log")
    args = ap.parse_args()
    samples = read_samples(open(args.util_csv).read())
    if not samples:
        raise SystemExit(f"{args.util_csv}: no nvidia-smi samples")
    day = samples[0][0].replace(hour=0, minute=0, second=0, microsecond=0)
    print(markdown(per_stage(samples, read_stages(open(args.audit_log).read(), day))))


if __name__ == "__main__":
    main()
