"""W8A8 GEMM benchmark on the GPU: CUTLASS and Triton against torch._int_mm and bf16.

For each Qwen3 model (1.7B, 8B, 14B), each distinct Linear shape (N x K) and
M in {1, 16, 128, 512, 2048, 4096, 8192}, plus 8192^3, times in one run:
  cutlass   kernels.cutlass.scaled_mm  (int8 GEMM + fused CUTLASS-order epilogue -> bf16)
  triton    kernels.triton.scaled_mm   (int8 GEMM + fused Triton-order epilogue -> bf16)
  int_mm    torch._int_mm (cuBLAS int8 -> int32) alone; TOPS are computed from this
  int_mm+s  torch._int_mm then the scales applied as a separate elementwise op -> bf16
            (what a user of cuBLAS would have to add; reported beside, not in TOPS)
  bf16      torch.matmul of bf16 operands of the same shape (TFLOP/s)
torch._int_mm needs M > 16, so it has no entry at M = 1 and 16.
Timing: each backend's calls over several copies of the operands (at least 256 MiB in all,
so weights come from HBM, not from the 60 MiB L2, as in a real model) are captured in one
CUDA graph; the graph is replayed and timed with CUDA events; the time per call is the
median over 5 batches. The graph removes Python launch overhead, which would otherwise
dominate every small-M point. TOPS = 2*M*N*K / time.
If a graph capture fails, that point is timed with triton.testing.do_bench on one operand
copy instead (L2-warm, not comparable): it is marked "method": "do_bench-fallback" in the
JSON (per backend and shape, per layer, and listed under "do_bench_fallback" for the
sweeps) and with a * in the markdown.
Also sweeps every tile config of both kernels over M on one shape (Qwen3-8B gate/up) and at
8192^3: tile choice is free of any effect on the bits (exact int32 accumulation), so it
is chosen for speed only.
Writes kernels_bench.json and kernels_bench.md into --out.
"""

import argparse
import os
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _qwen3_shapes import QWEN3  # noqa: E402
from _timing import GRAPH, graph_ms  # noqa: E402

from requant.io.output import write_bytes_atomic, write_json_atomic  # noqa: E402
from requant.kernels import cutlass as ck  # noqa: E402
from requant.kernels import triton as tk  # noqa: E402
from requant.kernels.triton.scaled_mm import CONFIGS as TRITON_CONFIGS  # noqa: E402

MS = [1, 16, 128, 512, 2048, 4096, 8192]
BACKENDS = ["cutlass", "triton", "int_mm", "int_mm+s", "bf16"]


ROTATE_BYTES = 256 << 20


def _copies(m, n, k, elem=1):
    return max(1, min(64, -(-ROTATE_BYTES // ((m * k + n * k) * elem + m * n * 2))))


def operands(m, n, k):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s_a = torch.rand(m, 1, device="cuda") * 0.05 + 1e-4
    s_w = torch.rand(n, 1, device="cuda") * 0.01 + 1e-5
    return a, w, s_a, s_w


def bench_shape(m, n, k, rep):
    sets = [operands(m, n, k) for _ in range(_copies(m, n, k))]
    bsets = [
        (torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        for _ in range(_copies(m, n, k, elem=2))
    ]

    def int_mm_scaled(a, w, s_a, s_w):
        return (torch._int_mm(a, w.t()).float() * s_a * s_w.reshape(1, -1)).to(torch.bfloat16)

    fns = {
        "cutlass": [lambda o=o: ck.scaled_mm(*o) for o in sets],
        "triton": [lambda o=o: tk.scaled_mm(*o) for o in sets],
        "bf16": [lambda b=b: torch.matmul(b[0], b[1].t()) for b in bsets],
    }
    if m > 16:
        fns["int_mm"] = [lambda o=o: torch._int_mm(o[0], o[1].t()) for o in sets]
        fns["int_mm+s"] = [lambda o=o: int_mm_scaled(*o) for o in sets]
    out = {}
    for name, fl in fns.items():
        ms, method = graph_ms(fl, rep)
        out[name] = {"ms": ms, "tops": 2 * m * n * k / ms / 1e9, "method": method}
    return out


def _tops_points(m, n, k, rep, fls):
    """{key: TOPS} for {key: calls}, and the keys timed by the do_bench fallback."""
    res, fallback = {}, []
    for key, fl in fls.items():
        ms, method = graph_ms(fl, rep)
        res[key] = 2 * m * n * k / ms / 1e9
        if method != GRAPH:
            fallback.append(key)
    return res, fallback


def sweep(m, n, k, rep, swizzles=(1,)):
    sets = [operands(m, n, k) for _ in range(_copies(m, n, k))]
    fls = {}
    for tile, name in ck.TILES.items():
        for sw in swizzles:
            key = f"cutlass:{name}" + (f":sw{sw}" if len(swizzles) > 1 else "")
            fls[key] = [lambda o=o, t=tile, sw=sw: ck.scaled_mm(*o, tile=t, swizzle=sw) for o in sets]
    for name in TRITON_CONFIGS:
        fls[f"triton:{name}"] = [lambda o=o, c=name: tk.scaled_mm(*o, config=c) for o in sets]
    return _tops_points(m, n, k, rep, fls)


def square_cutlass_tiles(rep, n=8192):
    sets = [operands(n, n, n) for _ in range(_copies(n, n, n))]
    idx = {name: t for t, name in ck.TILES.items()}
    fls = {"default": [lambda o=o: ck.scaled_mm(*o) for o in sets]}
    for name in ("medium", "large"):  # the default tile and the one alternative kept
        for sw in (1, 8):
            fls[f"{name}:sw{sw}"] = [lambda o=o, t=idx[name], sw=sw: ck.scaled_mm(*o, tile=t, swizzle=sw) for o in sets]
    return _tops_points(n, n, n, rep, fls)


def _star(fallback: bool) -> str:
    return "*" if fallback else ""


def markdown(result):
    lines = []
    fb = result.get("do_bench_fallback", {})
    any_fallback = bool(any(fb.values()))
    for key, when in (("square_8192", "first"), ("square_8192_end", "last")):
        sq = result[key]
        lines.append(
            f"8192 x 8192 x 8192 ({when} in the run): "
            + ", ".join(
                f"{b} {sq[b]['tops']:.0f}{_star(sq[b].get('method', GRAPH) != GRAPH)}" for b in BACKENDS if b in sq
            )
            + " (TOPS; bf16 in TFLOP/s; int_mm+s counts the separate scale op)"
        )
        any_fallback |= any(v.get("method", GRAPH) != GRAPH for v in sq.values())
        lines.append("")
    if "square_8192_cutlass_early" in result:
        early_fb = fb.get("square_8192_cutlass_early", [])
        lines.append(
            "8192^3 CUTLASS tiles, measured right after the first line: "
            + ", ".join(f"{k} {v:.0f}{_star(k in early_fb)}" for k, v in result["square_8192_cutlass_early"].items())
            + " (TOPS)"
        )
        lines.append("")
    lines.append("")
    lines.append("One decoder layer's Linears (q, k, v, o, gate, up, down; summed times), TOPS:")
    lines.append("")
    lines.append(
        "| model | M | CUTLASS | Triton | torch._int_mm | _int_mm + scales | bf16 (TFLOP/s) | CUTLASS / _int_mm | Triton / CUTLASS |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in result["layers"]:
        t = row["tops"]
        meth = row.get("method", {})
        any_fallback |= any(v != GRAPH for v in meth.values())
        f = lambda b: f"{t[b]:.0f}{_star(meth.get(b, GRAPH) != GRAPH)}" if b in t else "n/a"  # noqa: E731
        r1 = f"{t['cutlass'] / t['int_mm']:.2f}" if "int_mm" in t else "n/a"
        r2 = f"{t['triton'] / t['cutlass']:.2f}"
        lines.append(
            f"| {row['model']} | {row['m']} | {f('cutlass')} | {f('triton')} | {f('int_mm')} | {f('int_mm+s')} | {f('bf16')} | {r1} | {r2} |"
        )
    lines.append("")
    lines.append("Per shape, TOPS (cutlass / triton / int_mm / bf16):")
    lines.append("")
    lines.append("| model | Linear | N x K | " + " | ".join(f"M={m}" for m in MS) + " |")
    lines.append("| --- | --- | --- | " + " | ".join("---" for _ in MS) + " |")
    for model, lins in QWEN3.items():
        if not any(key.startswith(model + "|") for key in result["shapes"]):
            continue  # not in --models
        for lin, n, k, _ in lins:
            cells = []
            for m in MS:
                r = result["shapes"][f"{model}|{lin}|{m}"]
                cells.append(
                    " / ".join(
                        f"{r[b]['tops']:.0f}{_star(r[b].get('method', GRAPH) != GRAPH)}" if b in r else "-"
                        for b in ("cutlass", "triton", "int_mm", "bf16")
                    )
                )
            lines.append(f"| {model} | {lin} | {n} x {k} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Tile sweeps (TOPS):")
    lines.append("")
    for key, res in result["sweeps"].items():
        best = max(res, key=res.get)
        sfb = fb.get(key, [])
        lines.append(
            f"- {key}: " + ", ".join(f"{k} {v:.0f}{_star(k in sfb)}" for k, v in res.items()) + f"  (best: {best})"
        )
    if any_fallback:
        lines.append("")
        lines.append(
            "\\* timed by triton.testing.do_bench on one operand copy (CUDA graph capture failed): "
            "L2-warm, not comparable with the other points."
        )
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--rep", type=int, default=40, help="timing budget per point, ms (5 batches of graph replays)")
    p.add_argument("--models", default=",".join(QWEN3))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    ck.build()
    result = {
        "command": "python3 benchmarks/bench_kernels.py " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "timing": "CUDA graph over >= 256 MiB of rotated operand copies, CUDA events, median of 5 batches",
        "shapes": {},
        "layers": [],
        "sweeps": {},
        # Points timed by the do_bench fallback, per sweep (bench_shape points carry "method").
        "do_bench_fallback": {},
    }
    result["square_8192"] = bench_shape(8192, 8192, 8192, rep=100)
    print("8192^3", {b: round(v["tops"]) for b, v in result["square_8192"].items()}, flush=True)
    # Right after, on the still cool chip: the default CUTLASS tile and the Cooperative 128x256
    # (which led the late 8192^3 sweep of the first run with swizzle 8), swizzles 1 and 8.
    result["square_8192_cutlass_early"], result["do_bench_fallback"]["square_8192_cutlass_early"] = (
        square_cutlass_tiles(100)
    )
    print(
        "8192^3 CUTLASS tiles early", {k: round(v) for k, v in result["square_8192_cutlass_early"].items()}, flush=True
    )
    for model in args.models.split(","):
        for m in MS:
            total_ops = 0.0
            total_ms = {}
            methods = {}
            for lin, n, k, count in QWEN3[model]:
                r = bench_shape(m, n, k, args.rep)
                result["shapes"][f"{model}|{lin}|{m}"] = dict(r, n=n, k=k)
                total_ops += 2.0 * m * n * k * count
                for b, v in r.items():
                    total_ms[b] = total_ms.get(b, 0.0) + v["ms"] * count
                    if v["method"] != GRAPH:  # one fallback shape marks the layer's sum
                        methods[b] = v["method"]
                    methods.setdefault(b, GRAPH)
            tops = {b: total_ops / ms / 1e9 for b, ms in total_ms.items()}
            result["layers"].append({"model": model, "m": m, "ms": total_ms, "tops": tops, "method": methods})
            print(model, m, {b: round(v) for b, v in tops.items()}, flush=True)
    sweeps = [(f"Qwen3-8B gate,up 12288x4096 M={m}", (m, 12288, 4096, args.rep)) for m in MS]
    sweeps += [(f"Qwen3-1.7B q,o 2048x2048 M={m}", (m, 2048, 2048, args.rep, (1, 8))) for m in (512, 2048, 8192)]
    sweeps.append(("8192^3", (8192, 8192, 8192, 100, (1, 4, 8))))
    for key, sweep_args in sweeps:
        result["sweeps"][key], result["do_bench_fallback"][key] = sweep(*sweep_args)
    # Again at the end, after minutes of load: the chip's clocks drop as it warms.
    result["square_8192_end"] = bench_shape(8192, 8192, 8192, rep=100)
    print("8192^3 at the end", {b: round(v["tops"]) for b, v in result["square_8192_end"].items()}, flush=True)
    for key, res in result["sweeps"].items():
        print("sweep", key, {k: round(v) for k, v in res.items()}, flush=True)
    result["elapsed_s"] = time.time() - t0
    write_json_atomic(os.path.join(args.out, "kernels_bench.json"), result)
    md = markdown(result)
    write_bytes_atomic(
        os.path.join(args.out, "kernels_bench.md"),
        (
            f"# W8A8 kernel benchmark\n\n{result['device']}, torch {result['torch']}, triton {result['triton']}, CUDA {result['cuda']}\n"
            f"Command: `{result['command']}`, run by `bash benchmarks/gpu_kernels.sh` on the device machine\n\n{md}"
        ).encode(),
    )
    print(md)


if __name__ == "__main__":
    main()
