"""The report of benchmarks/vllm_speed.py: a Markdown table for docs/results.md and one README row,
from the recorded vllm_speed.json (no GPU).

    python3 -m benchmarks.vllm_speed_report DIR/vllm_speed.json [--md OUT.md] [--readme-row]

Tokens/s: median [min-max] of the repetitions; the ratio columns divide requant's median by each
vLLM mode's. Goal: requant ahead of vLLM batch-invariant on every row and at least 0.9x
plain vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from requant.io.markdown import table

__all__ = ["markdown", "readme_row", "main"]

GOAL_VS_PLAIN = 0.9
HBM = {"H200": 4.8e12, "H100": 3.35e12}  # bytes/s of the SXM parts' HBM (datasheets)


def bound_line(run: dict | None, device: str) -> str | None:
    """requant's batch-1 decode against the weight-read bound (weight bytes / HBM bytes/s)."""
    r = (run or {}).get("results", {})
    case = next((c for c in r if c.startswith("decode b1 ")), None)
    hbm = next((v for k, v in HBM.items() if k in device), None)
    wb = (run or {}).get("weight_bytes_per_step")
    if case is None or hbm is None or not wb:
        return None
    bound_ms, ms = 1e3 * wb / hbm, r[case]["ms_per_step"]
    return (
        f"requant {case}: {ms:.3f} ms a step; the weight-read bound {bound_ms:.3f} ms ({wb / 1e9:.2f} GB at "
        f"{hbm / 1e12:.2f} TB/s): {bound_ms / ms:.0%} of it"
    )


def _runs(rec: dict) -> dict:
    return {r["engine"]: r for r in rec["runs"]}


def _median(run: dict | None, case: str, field: str = "tok_s"):
    r = (run or {}).get("results", {}).get(case)
    return r[field]["median"] if r else None


def _cell(run: dict | None, case: str, field: str, fmt: str) -> str:
    r = (run or {}).get("results", {}).get(case)
    if r is None:
        err = (run or {}).get("errors", {}).get(case)
        return "failed" if err else "-"
    s = r[field]
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _goal(rq, plain, bi) -> str:
    if rq is None or plain is None or bi is None:
        return "-"
    return "met" if rq > bi and rq >= GOAL_VS_PLAIN * plain else "not met"


def _describe(run: dict) -> str:
    bits = [run.get("label", run["engine"])]
    if run["engine"].startswith("vllm"):
        bits.append("torch.compile" if run.get("compile", True) else "no torch.compile")
        cfg = run.get("config", {})
        if "cudagraph_mode" in cfg:
            bits.append(f"CUDA graphs {cfg['cudagraph_mode']}")
        if "enable_prefix_caching" in cfg:
            bits.append(f"prefix caching {cfg['enable_prefix_caching']}")
    if run["engine"] == "requant":
        bits.append(f"{run.get('backend', '?')} backend, CUDA graphs")
    if "startup_s" in run:
        bits.append(f"startup {run['startup_s']} s")
    if run.get("process_rc") not in (None, 0):
        bits.append(f"process rc {run['process_rc']}")
    errs = run.get("errors", {})
    if errs:
        first = next(iter(errs.items()))
        bits.append(f"{len(errs)} failed ({first[0]}: {first[1][:120]})")
    return ", ".join(map(str, bits))


def markdown(rec: dict) -> str:
    runs = _runs(rec)
    order = [e for e in ("requant", "vllm", "vllm-bi", "transformers") if e in runs]
    device = next((r["device"] for r in runs.values() if r.get("device")), "?")
    lines = [
        f"# requant beside vLLM ({device}, commit {rec.get('commit')})",
        "",
        f"Checkpoint `{rec.get('model')}`. Each engine in its own process, one after the other:",
        "",
        *[f"- {_describe(runs[e])}" for e in order],
        "",
        "How each figure was timed:",
        "",
    ]
    seen = set()
    for e in order:
        t = runs[e].get("timing")
        if t and json.dumps(t) not in seen:
            seen.add(json.dumps(t))
            lines += [f"- {runs[e].get('label', e)}: prefill: {t['prefill']}; decode: {t['decode']}"]
    settings = next((r["settings"] for r in runs.values() if r.get("settings")), {})
    lines += [
        f"- median [min-max] of {settings.get('reps', '?')} repetitions; decode: {settings.get('steps', '?')} "
        "steps per repetition, the prompt C - steps - 8 ids long",
        "",
    ]
    labels = [runs[e].get("label", e) for e in order]
    head = ["tokens/s", *labels, "requant / vLLM", "requant / vLLM batch-invariant", "goal"]
    rows = []
    for case in rec["cases"]:
        rq, plain, bi = (_median(runs.get(e), case) for e in ("requant", "vllm", "vllm-bi"))
        rows.append(
            [case, *(_cell(runs[e], case, "tok_s", ".0f") for e in order), _ratio(rq, plain), _ratio(rq, bi),
             _goal(rq, plain, bi)]
        )  # fmt: skip
    lines += [*table(head, rows, align="l" + "r" * (len(head) - 2) + "l"), ""]
    bound = bound_line(runs.get("requant"), device)
    if bound:
        lines += [bound, ""]
    pre = [c for c in rec["cases"] if c.startswith("prefill")]
    if pre:
        rows = [[f"TTFT {c.split()[1]} (ms)", *(_cell(runs[e], c, "ttft_ms", ".1f") for e in order)] for c in pre]
        lines += [*table(["time to first token", *labels], rows, align="l" + "r" * len(order)), ""]
    return "\n".join(lines) + "\n"


def readme_row(rec: dict) -> str:
    """One row of README's results table (| result | figure | measured on | page |)."""
    runs = _runs(rec)
    rq, plain, bi = runs.get("requant"), runs.get("vllm"), runs.get("vllm-bi")
    parts = []
    for case in rec["cases"]:
        if case not in ("decode b1 c128", "decode b64 c128", "prefill 8192"):
            continue
        r, p, b = (_median(x, case) for x in (rq, plain, bi))
        if r is None:
            continue
        parts.append(f"{case}: {r:,.0f} tok/s (vLLM {_ratio(r, p)}, batch-invariant {_ratio(r, b)})")
    met = [_goal(*(_median(x, c) for x in (rq, plain, bi))) for c in rec["cases"]]
    goal = f"goal met on {met.count('met')}/{len(met)} rows"
    device = next((r["device"] for r in runs.values() if r.get("device")), "?")
    figure = "; ".join(parts) + f"; {goal}" if parts else "not measured"
    return (
        f"| requant's fast engine beside vLLM 0.26 (plain, batch-invariant), Qwen3-8B shape, pow2 | {figure} "
        f"| {device}, random weights | [results](docs/results.md#requant-beside-vllm) |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", help="vllm_speed.json")
    ap.add_argument("--md", default=None, help="write the Markdown here (default: print it)")
    ap.add_argument("--readme-row", action="store_true", help="print README's row instead")
    a = ap.parse_args(argv)
    try:
        rec = json.loads(Path(a.record).read_text())
        rec["runs"], rec["cases"]  # noqa: B018 (the two keys every report reads)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {a.record}: not a vllm_speed.json record ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    if a.readme_row:
        print(readme_row(rec))
        return 0
    text = markdown(rec)
    if a.md:
        Path(a.md).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
