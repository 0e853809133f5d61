"""Markdown and a figure for bench_speed.json (benchmarks/bench_speed.py): the speed goals,
judged on the numbers of the same run, then every table. markdown(result) -> str; the part
after the `<!-- summary -->` marker is the short summary the GPU script prints last.
figure(result, path) draws graph TOPS per backend on every Qwen3 Linear at M >= 512, and
eager / graph per backend (what the host path costs) at every point, into a PNG.

    python3 -m benchmarks.bench_speed_report bench_speed.json [--md bench_speed.md] [--png bench_speed.png]

Without --md the Markdown goes to stdout. Works on a partial JSON (a run stopped by its budget),
and on the stored runs that still time the `plain` backend (benchmarks/results/speed_gpu/).
"""

import argparse
import json
import sys
from pathlib import Path

from requant.io.markdown import table
from requant.io.output import write_bytes_atomic, write_files_atomic

CUTLASS_TILES = {"decode": (16, 64), "small": (64, 64), "mid": (64, 128), "medium": (128, 128), "large": (128, 256)}
GEMM = ["cutlass", "triton", "triton_before", "plain", "int_mm", "bf16"]
SMS = 132


def _t(r, mode, b):
    v = r.get(mode, {}).get(b)
    return v["tops"] if v else None


def _f(x, fmt="{:.0f}"):
    return "n/a" if x is None else fmt.format(x)


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _fill(sel, m, n):
    tile = sel.split()[0]
    tm, tn = CUTLASS_TILES.get(tile, (None, None))
    if tm is None:
        return "n/a"
    tiles = -(-m // tm) * -(-n // tn)
    return f"{tiles} ({tiles / (-(-tiles // SMS) * SMS):.2f})"


def _qwen_points(result, ms):
    for key, r in result["points"].items():
        if "|" in key and r.get("m") in ms:
            yield key, r


def goals(result):
    """[(goal, value text, met: True/False/None)] from the graph numbers (eager alongside)."""
    out = []
    sq = result["points"].get("8192^3")
    c = _t(sq, "graph", "cutlass") if sq else None
    out.append(
        (
            "CUTLASS >= 1500 TOPS at 8192^3 (graph)",
            f"{_f(c)} TOPS" + (f", eager {_f(_t(sq, 'eager', 'cutlass'))}" if sq else ""),
            None if c is None else c >= 1500,
        )
    )
    for name, num, den, bound, mode in (
        ("CUTLASS >= 1.5x torch._int_mm", "cutlass", "int_mm", 1.5, "graph"),
        ("Triton >= 0.85x CUTLASS", "triton", "cutlass", 0.85, "graph"),
        ("Triton >= 0.85x CUTLASS, eager", "triton", "cutlass", 0.85, "eager"),
    ):
        ratios = [
            (_ratio(_t(r, mode, num), _t(r, mode, den)), key) for key, r in _qwen_points(result, (512, 2048, 8192))
        ]
        ratios = [(x, key) for x, key in ratios if x is not None]
        if not ratios:
            out.append((f"{name} at every Qwen3 Linear, M >= 512", "not measured", None))
            continue
        met = sum(x >= bound for x, _ in ratios)
        worst = min(ratios)
        out.append(
            (
                f"{name} at every Qwen3 Linear, M >= 512 ({mode})",
                f"{met}/{len(ratios)} shapes; lowest {worst[0]:.2f} ({worst[1]})",
                met == len(ratios),
            )
        )
    r = result["points"].get("Qwen3-1.7B|gate,up|512")
    if r:
        e_new, e_old, g_new = _t(r, "eager", "triton"), _t(r, "eager", "triton_before"), _t(r, "graph", "triton")
        out.append(
            (
                "Eager Triton at 512 x 2048 x 6144 within 10% of its graph time (first measured: 215 TOPS eager, plain kernel 636)",
                f"before {_f(e_old)}, after {_f(e_new)}, plain {_f(_t(r, 'eager', 'plain'))}, graph {_f(g_new)} TOPS",
                None if e_new is None or g_new is None else e_new >= 0.9 * g_new,
            )
        )
    return out


def markdown(result):
    L = []
    add = L.append
    add("# W8A8 GEMM speed: eager and CUDA graphs\n")
    add(
        f"{result.get('device')}, torch {result.get('torch')}, triton {result.get('triton')}, CUDA {result.get('cuda')}; "
        f"commit {result.get('commit')}; `{result.get('command')}` (run by `bash benchmarks/gpu_speed.sh`), "
        f"{result.get('elapsed_s', 0):.0f} s.\n"
    )
    add(f"Timing: {result.get('timing', '')}\n")
    add(
        'TOPS = 2 M N K / t (bf16: TFLOP/s). Peak: 1979 dense int8 TOPS at 1830 MHz; "% peak" uses 1979, '
        '"% at clock" scales it to the SM clock nvidia-smi reported at the start of the point\'s timing.\n'
    )
    if result.get("checks"):
        add(
            "Bit checks before timing (against kernels.reference.scaled_mm_triton_order): "
            + ", ".join(f"{k} {'ok' if v else 'DIFFERENT'}" for k, v in result["checks"].items())
            + "\n"
        )
    if result.get("cutlass_error"):
        add(f"- CUTLASS not timed: {result['cutlass_error']}")
    if result.get("stopped") and result["stopped"] != "finished":
        add(f"- run stopped: {result['stopped']}")
    for k, v in result.get("failed", {}).items():
        add(f"- FAILED {k}: {v.splitlines()[0][:200] if v else v}")
    if result.get("skipped"):
        add(
            f"- skipped (time budget or stop): {len(result['skipped'])} items: {', '.join(result['skipped'][:12])}"
            + (" ..." if len(result["skipped"]) > 12 else "")
        )
    add("")
    add("## Goals, from this run\n")
    rows = [[g, v, "n/a" if met is None else ("**yes**" if met else "**no**")] for g, v, met in goals(result)]
    L.extend(table(["goal", "this run", "met"], rows))
    add("")
    for key, when in (("8192^3", "first in the run"), ("8192^3 end", "last in the run, after minutes of load")):
        r = result["points"].get(key)
        if not r:
            continue
        st = r.get("gpu", {})
        add(
            f"## 8192 x 8192 x 8192, {when} (SM clock {st.get('clock_mhz', 'n/a')} MHz, {st.get('power_w', 'n/a')} W, "
            f"{st.get('temp_c', 'n/a')} C; CUTLASS {r['selected']['cutlass']}, Triton {r['selected']['triton']})\n"
        )
        rows = []
        for b in GEMM:
            g, e = r.get("graph", {}).get(b), r.get("eager", {}).get(b)
            if not g and not e:
                continue
            clock = st.get("clock_mhz")
            at_clock = (g["tops"] / (1979 * clock / 1830) * 100) if (g and clock) else None
            rows.append(
                [b, _f(g and g["tops"]), _f(g and g["spread"] * 100, "{:.1f}%"), _f(e and e["tops"])]
                + [
                    _f(e and e["spread"] * 100, "{:.1f}%"),
                    _f(g and g["tops"] / 19.79, "{:.0f}%"),
                    _f(at_clock, "{:.0f}%"),
                ]
            )
        header = ["backend", "graph TOPS", "spread", "eager TOPS", "spread", "% peak (graph)", "% at clock"]
        L.extend(table(header, rows, align="lrrrrrr"))
        add("")
    add("## Qwen3 Linears, M >= 512 (TOPS; graph, then eager)\n")
    add(
        "CUTLASS tiles: the default tile and swizzle, its tile count and last-wave fill over 132 SMs. "
        "before = the Triton path as of commit 7b4df52 (its own config and host path).\n"
    )
    rows = []
    for key, r in sorted(
        _qwen_points(result, (512, 2048, 8192)), key=lambda kv: (kv[1]["model"], kv[1]["m"], kv[1]["lin"])
    ):
        g = {b: _t(r, "graph", b) for b in GEMM}
        e = {b: _t(r, "eager", b) for b in GEMM}
        sel = r["selected"]
        rows.append(
            [r["model"], r["lin"], r["m"], sel["cutlass"], _fill(sel["cutlass"], r["m"], r["n"]), sel["triton"]]
            + [_f(g[b]) for b in GEMM]
            + [_f(e[b]) for b in ("cutlass", "triton", "triton_before", "plain")]
            + [_f(_ratio(g["cutlass"], g["int_mm"]), "{:.2f}"), _f(_ratio(g["triton"], g["cutlass"]), "{:.2f}")]
            + [_f(_ratio(e["triton"], e["cutlass"]), "{:.2f}"), _f(g["cutlass"] and g["cutlass"] / 19.79, "{:.0f}%")]
        )
    header = ["model", "Linear", "M", "CUTLASS tile", "tiles (fill)", "Triton cfg", "cutlass", "triton", "before"]
    header += ["plain", "int_mm", "bf16", "eager cutlass", "eager triton", "eager before", "eager plain"]
    L.extend(table([*header, "C/int_mm", "T/C", "T/C eager", "C % peak"], rows, align="llrlll" + "r" * 14))
    add("")
    add("## One decoder layer's Linears (q, k, v, o, gate, up, down; summed times), TOPS, graph / eager\n")
    header = ["model", "M", "cutlass", "triton", "before", "plain", "int_mm", "bf16", "eager cutlass", "eager triton"]
    rows = []
    sums = {}
    for key, r in result["points"].items():
        if "|" not in key:
            continue
        s = sums.setdefault((r["model"], r["m"]), {"ops": 0.0, "ms": {}, "n": 0})
        s["ops"] += 2.0 * r["m"] * r["n"] * r["k"] * r["count"]
        s["n"] += 1
        for mode in ("graph", "eager"):
            for b, v in r.get(mode, {}).items():
                s["ms"][(mode, b)] = s["ms"].get((mode, b), 0.0) + v["ms"] * r["count"]
    for (model, m), s in sorted(sums.items()):
        if s["n"] != 4:
            continue  # a layer with a Linear missing (time budget) is not summed

        def tops(mode, b, s=s):
            ms = s["ms"].get((mode, b))
            return None if ms is None else s["ops"] / ms / 1e9

        rows.append(
            [model, m, *(_f(tops("graph", b)) for b in GEMM)]
            + [_f(tops("eager", b)) for b in ("cutlass", "triton", "triton_before")]
        )
    L.extend(table([*header, "eager before"], rows, align="lr" + "r" * 9))
    add("")
    dec = sorted(_qwen_points(result, (1, 16, 128)), key=lambda kv: (kv[1]["model"], kv[1]["m"], kv[1]["lin"]))
    if dec:
        add("## Decode-ish M (1, 16, 128): microseconds per call, graph / eager\n")
        rows = []
        for key, r in dec:

            def us(mode, b, r=r):
                v = r.get(mode, {}).get(b)
                return None if not v else v["ms"] * 1e3

            five = ("cutlass", "triton", "triton_before", "plain", "bf16")
            rows.append(
                [r["model"], r["lin"], r["m"], r["selected"]["cutlass"], r["selected"]["triton"]]
                + [_f(us("graph", b), "{:.1f}") for b in five]
                + [_f(us("eager", b), "{:.1f}") for b in five]
            )
        header = ["model", "Linear", "M", "CUTLASS tile", "Triton cfg", "cutlass", "triton", "before", "plain", "bf16"]
        header += ["eager cutlass", "eager triton", "eager before", "eager plain", "eager bf16"]
        L.extend(table(header, rows, align="llrll" + "r" * 10))
        add("")
    if result.get("layers"):
        add("## One Qwen3-8B decoder layer's Linears with their 4 activation quantizations, microseconds per layer\n")
        add(
            "before = the former Triton host path and the former per-call NaN check (a device sync; not capturable). "
            "CUTLASS before differs from after only in the quantization.\n"
        )
        rows = []
        for m, r in sorted(result["layers"].items(), key=lambda kv: int(kv[0])):

            def us(mode, b, r=r):
                v = r.get(mode, {}).get(b)
                return None if not v else v["ms"] * 1e3

            cols = [("eager", "cutlass:before"), ("eager", "cutlass:after"), ("graph", "cutlass:after")]
            cols += [("eager", "triton:before"), ("eager", "triton:after"), ("graph", "triton:after")]
            rows.append([m, *(_f(us(mode, b), "{:.0f}") for mode, b in cols)])
        header = ["M", "cutlass before (eager)", "cutlass after (eager)", "cutlass after (graph)"]
        header += ["triton before (eager)", "triton after (eager)", "triton after (graph)"]
        L.extend(table(header, rows, align="r" * 7))
        add("")
    if result.get("quantize"):
        add("## quantize_activations (Triton, K = 4096), eager microseconds per call\n")
        rows = [
            [m, _f(r.get("before", {}).get("us"), "{:.1f}"), _f(r.get("after", {}).get("us"), "{:.1f}")]
            for m, r in result["quantize"].items()
        ]
        L.extend(table(["M", "before (check syncs, JIT launch)", "after"], rows, align="rrr"))
        add("")
    if result.get("sweeps"):
        add("## Tile sweeps (graph TOPS; CUTLASS `tile:swizzle`, no swizzle = the default)\n")
        for key, s in result["sweeps"].items():
            if not s["tops"]:
                continue
            best = max(s["tops"], key=s["tops"].get)
            add(
                f"- {key}: "
                + ", ".join(f"{k} {v:.0f}" for k, v in s["tops"].items())
                + f" (best: {best})"
                + (f"; errors: {s['errors']}" if s.get("errors") else "")
            )
        add("")
    add("<!-- summary -->")
    add("Summary (graph unless said; full tables above):\n")
    rows = [[g, v, "n/a" if met is None else ("yes" if met else "no")] for g, v, met in goals(result)]
    L.extend(table(["goal", "this run", "met"], rows))
    return "\n".join(L) + "\n"


def figure(result, path):
    """PNG: graph TOPS per backend on every Qwen3 Linear at M >= 512 (top), eager / graph time
    ratio of cutlass, triton and triton_before at every point (bottom; > 1: the host is slower
    than the GPU). Returns False (and draws nothing) without matplotlib or data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pts = sorted(_qwen_points(result, (512, 2048, 8192)), key=lambda kv: (kv[1]["model"], kv[1]["m"], kv[1]["lin"]))
    if result["points"].get("8192^3"):
        pts = [("8192^3", result["points"]["8192^3"])] + pts
    every = sorted(
        ((k, r) for k, r in result["points"].items() if r.get("eager")),
        key=lambda kv: (kv[1].get("model", ""), kv[1]["m"], kv[1].get("lin", "")),
    )
    if not pts and not every:
        return False
    fig, axes = plt.subplots(2, 1, figsize=(max(12, 0.45 * max(len(pts), len(every))), 10))

    def label(key, r):
        return "8192^3" if "|" not in key else f"{r['model'].replace('Qwen3-', '')} {r['lin']} M={r['m']}"

    backends = [b for b in GEMM if b != "triton_before"]
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        axes[0].bar([j + i * width for j in range(len(pts))], [_t(r, "graph", b) or 0 for _, r in pts], width, label=b)
    axes[0].axhline(1979, color="k", lw=0.8, ls="--", label="H200 dense int8 peak")
    axes[0].set_xticks(
        [j + 0.4 - width / 2 for j in range(len(pts))], [label(k, r) for k, r in pts], rotation=75, fontsize=7
    )
    axes[0].set_ylabel("TOPS (CUDA graph)")
    axes[0].legend(fontsize=7, ncol=4)
    axes[0].set_title(f"W8A8 GEMM, {result.get('device')}, commit {result.get('commit')}")
    for b in ("cutlass", "triton", "triton_before"):
        ys = []
        for _, r in every:
            e, g = r.get("eager", {}).get(b), r.get("graph", {}).get(b)
            ys.append(e["ms"] / g["ms"] if e and g else float("nan"))
        axes[1].plot(range(len(every)), ys, "o-", ms=3, label=b)
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set_yscale("log")
    axes[1].set_xticks(range(len(every)), [label(k, r) for k, r in every], rotation=75, fontsize=6)
    axes[1].set_ylabel("eager time / graph time")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    write_files_atomic([(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format="png"))])
    plt.close(fig)
    return True


def main():
    p = argparse.ArgumentParser(description="Markdown (and a PNG) from bench_speed.json")
    p.add_argument("json")
    p.add_argument("--md", help="write the Markdown here (default: stdout)")
    p.add_argument("--png", help="also draw the figure here")
    args = p.parse_args()
    with open(args.json) as f:
        result = json.load(f)
    md = markdown(result)
    if args.md:
        write_bytes_atomic(args.md, md.encode())
    else:
        print(md, end="")
    if args.png and not figure(result, args.png):
        print("no figure (matplotlib missing or no points)", file=sys.stderr)


if __name__ == "__main__":
    main()
