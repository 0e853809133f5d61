"""Split-K of the Triton W8A8 GEMM at decode M, one GPU: "decode_splitk" against the unsplit
"decode" tile on the fast engine's Qwen3-8B Linears (q,k,v and gate,up stacked along N).

    python3 -m benchmarks.bench_splitk --out DIR [--rep-ms 200] [--m 1,4,8] [--slots 66,132,264,528]
    python3 -m benchmarks.bench_splitk --smoke --out DIR     # CPU: TRITON_INTERPRET=1, tiny shapes

Per (M, Linear): ms per call of each config captured in a CUDA graph over rotated weight copies
(at least 256 MiB, so the weights stream from HBM as in a model; _timing.graph_ms), the weight
bytes per second, the split count split_k picks, the config config_for picks, and whether the
two configs give the same bits (they must: the int32 sum is exact). JSON and Markdown under --out.

--slots sweeps scaled_mm.SLOTS (the programs split_k aims at; restored after): "decode_splitk" at
each value, its bits against "decode" too. The summary chooses split-K's defaults from the rows:
the SLOTS value with the least total split-K time over the rows, and the
largest M up to which split-K (at that SLOTS) beats the unsplit tile on every Linear whose
output has fewer than SMS column tiles (the Linears the rule splits; SPLIT_K_MAX_M's choice).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from requant.io.markdown import table  # noqa: E402

# the fast engine's Linears at Qwen3-8B: (name, N, K)
LINEARS_8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288)]
SMOKE = [("tiny", 130, 600), ("tiny_k", 64, 1024)]


def measure(ms, shapes, device: str, rep_ms: float, timed: bool, slots=()) -> list[dict]:
    mm = importlib.import_module("requant.kernels.triton.scaled_mm")
    production = mm.SLOTS
    g = torch.Generator().manual_seed(0)
    rows = []
    for m in ms:
        for name, n, k in shapes:
            copies = max(1, min(32, (256 << 20) // (n * k))) if timed else 1
            ws = [torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g).to(device) for _ in range(copies)]
            a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g).to(device)
            s_a = torch.rand(m, 1, generator=g).to(device) + 0.5
            s_w = torch.ldexp(torch.ones(n, 1), torch.randint(-14, -3, (n, 1), generator=g)).to(device)
            row = {
                "m": m,
                "linear": name,
                "n": n,
                "k": k,
                "config_for": mm.config_for(m, n),
                "splits": mm.split_k(-(-n // 64), k, 256)[0],
            }
            outs = {c: mm.scaled_mm(a, ws[0], s_a, s_w, config=c) for c in ("decode", "decode_splitk")}
            row["same_bits"] = torch.equal(outs["decode"].view(torch.int16), outs["decode_splitk"].view(torch.int16))
            if timed:
                from benchmarks._timing import graph_ms

                for c in ("decode", "decode_splitk"):
                    fns = [lambda w=w, c=c: mm.scaled_mm(a, w, s_a, s_w, config=c) for w in ws]
                    t, method = graph_ms(fns, rep_ms)
                    row[f"{c}_ms"] = t
                    row[f"{c}_weight_gb_s"] = n * k / (t * 1e-3) / 1e9
                    row["method"] = method
                row["speedup"] = row["decode_ms"] / row["decode_splitk_ms"]
            if slots:
                row["slots"] = {}
                try:
                    for v in slots:
                        mm.SLOTS = v  # split_k reads it at each call; the launch cache keys no grid
                        cell = {"splits": mm.split_k(-(-n // 64), k, 256)[0]}
                        got = mm.scaled_mm(a, ws[0], s_a, s_w, config="decode_splitk")
                        cell["same_bits"] = torch.equal(outs["decode"].view(torch.int16), got.view(torch.int16))
                        if timed:
                            fns = [lambda w=w: mm.scaled_mm(a, w, s_a, s_w, config="decode_splitk") for w in ws]
                            cell["ms"] = graph_ms(fns, rep_ms)[0]
                        row["slots"][str(v)] = cell
                finally:
                    mm.SLOTS = production
                row["same_bits"] = row["same_bits"] and all(c["same_bits"] for c in row["slots"].values())
            rows.append(row)
            del ws
    return rows


def summary(rows: list[dict], sms: int) -> dict:
    """Split-K's defaults chosen from timed rows with a SLOTS sweep (see the module docstring)."""
    swept = [r for r in rows if "slots" in r and all("ms" in c for c in r["slots"].values())]
    if not swept or not all("decode_ms" in r for r in swept):
        return {}
    values = list(swept[0]["slots"])
    total = {v: sum(r["slots"][v]["ms"] for r in swept) for v in values}
    best = min(total, key=total.get)
    split_rows = [r for r in swept if -(-r["n"] // 64) < sms]  # the Linears the rule would split
    wins = {}
    for r in split_rows:
        wins.setdefault(r["m"], []).append(r["slots"][best]["ms"] < r["decode_ms"])
    max_m = 0
    for m in sorted(wins):  # the largest M below which split-K wins on every such Linear
        if not all(wins[m]):
            break
        max_m = m
    return {"total_ms_by_slots": total, "slots": int(best), "split_k_max_m": max_m, "wins_by_m": wins}


def markdown(rec: dict) -> str:
    lines = [f"# Split-K at decode M ({rec['device']})", ""]
    timed = any("speedup" in r for r in rec["rows"])
    head = ["M", "Linear", "N x K", "config_for", "splits", "same bits"]
    if timed:
        head += ["decode ms", "decode_splitk ms", "speedup", "split-K weight GB/s"]
    rows = []
    for r in rec["rows"]:
        row = [r["m"], r["linear"], f"{r['n']} x {r['k']}", r["config_for"], r["splits"], r["same_bits"]]
        if timed:
            row += [
                f"{r['decode_ms']:.4f}", f"{r['decode_splitk_ms']:.4f}", f"{r['speedup']:.2f}x",
                f"{r['decode_splitk_weight_gb_s']:.0f}",
            ]  # fmt: skip
        rows.append(row)
    lines += table(head, rows)
    sweep = [r for r in rec["rows"] if "slots" in r]
    if sweep:
        values = list(sweep[0]["slots"])
        cells = [[r["m"], r["linear"], *(_slot_cell(r["slots"][v]) for v in values)] for r in sweep]
        lines += ["", f"SLOTS sweep (production {rec.get('slots_production')}): splits, ms, bits equal", ""]
        lines += table(["M", "Linear", *[f"SLOTS {v}" for v in values]], cells)
    if rec.get("summary"):
        sm = rec["summary"]
        lines += ["", f"Chosen: SLOTS {sm['slots']}, SPLIT_K_MAX_M {sm['split_k_max_m']} (total ms by SLOTS: "
                  + ", ".join(f"{k}: {v:.4f}" for k, v in sm["total_ms_by_slots"].items()) + ")"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _slot_cell(c: dict) -> str:
    ms = f", {c['ms']:.4f}" if "ms" in c else ""
    return f"{c['splits']}{ms}, {c['same_bits']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="1,4,8", help="decode rows (comma-separated)")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--slots", default="", help="SLOTS values to sweep (comma-separated; empty: none)")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter: tiny shapes, bits only")
    args = ap.parse_args(argv)
    parsed = {}
    for name in ("m", "slots"):
        text = getattr(args, name)
        try:
            parsed[name] = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            parsed[name] = []
        if (
            (name == "m" and not parsed[name])
            or any(v < 1 for v in parsed[name])
            or (text.strip() and not parsed[name])
        ):
            print(f"error: --{name} {text}: expected comma-separated positive integers", file=sys.stderr)
            return 2
    ms, slots = parsed["m"], parsed["slots"]
    mm = importlib.import_module("requant.kernels.triton.scaled_mm")
    if args.smoke:
        rec = {"device": "cpu (TRITON_INTERPRET=1)", "rows": measure(ms, SMOKE, "cpu", 0, False, slots)}
    else:
        if not torch.cuda.is_available():
            print("error: the benchmark needs CUDA (--smoke runs the CPU path)", file=sys.stderr)
            return 2
        rows = measure(ms, LINEARS_8B, "cuda", args.rep_ms, True, slots)
        rec = {"device": torch.cuda.get_device_name(), "rows": rows}
    rec["slots_production"], rec["split_k_max_m_production"] = mm.SLOTS, mm.SPLIT_K_MAX_M
    rec["summary"] = summary(rec["rows"], mm.SMS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_splitk.json").write_text(json.dumps(rec, indent=1))
    (out / "bench_splitk.md").write_text(markdown(rec))
    print(markdown(rec))
    return 0 if all(r["same_bits"] for r in rec["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
