"""W8A8 GEMM speed on one GPU, eager and under CUDA graphs, same process and moment, and the
per-call host overhead of the eager path.

    python3 -m benchmarks.bench_speed --out DIR [--budget-s 330] [--reps 5] [--no-cutlass]

Points: 8192^3, and every distinct Linear of Qwen3-1.7B/8B/14B (q,o / k,v / gate,up / down)
at M = 512, 2048, 8192 and, for decode-ish use, M = 1, 16, 128. Backends at each point:
  cutlass        requant.kernels.scaled_mm(backend="cutlass"), default tile and swizzle
  triton         requant.kernels.scaled_mm(backend="triton"), default config, cached launches
  triton_before  the Triton path as of commit 7b4df52: importlib resolution, a device
                 context, the former config_for (128x256, persistent for N >= 4096, above
                 M = 1024), launches through JITFunction every call (cached=False)
  int_mm         torch._int_mm (cuBLAS int8 -> int32; M > 16 only), no scales
  bf16           torch.matmul of bf16 operands (TFLOP/s)
Each backend is timed two ways, interleaved (repetition r of every backend before repetition r + 1 of
any, so clock drift hits all alike):
  eager  plain Python calls, as the runtime makes them, over rotated operand copies, timed with
         CUDA events around n calls (the GPU waits for the host when the host is slower);
  graph  the same calls captured in one CUDA graph (one call per operand copy), replayed.
Operand copies: at least 256 MiB in all (at most 64 copies), so weights come from HBM and not
from the 50 MiB L2, as in a model. Median over --reps repetitions of ~8 ms each, and the
spread (max - min) / median. TOPS = 2 M N K / t; distance from the H200's dense int8 peak
(1979 TOPS at 1830 MHz), also scaled to the SM clock sampled by nvidia-smi at each point.
Also: eager time of quantize_activations before/after (the former per-call NaN check synced
the device), one Qwen3-8B decoder layer's Linears with their quantizations eager and as a
graph (M = 1, 16, 512; before/after; both backends), and tile sweeps (graph) that test the
default choices: CUTLASS tiles x swizzles, Triton configs, at 8192^3 and on every Linear at
M = 512, 2048, 8192.
Writes bench_speed.json after every point, and bench_speed.md (bench_speed_report.py) at the
end, when --budget-s runs out (the rest is listed as skipped), and on SIGTERM (timeout).
Without a CUTLASS build (--no-cutlass, or build() failing) the other backends are still timed.
The plain tutorial-style kernel this benchmark once carried as its own copy is Triton's
`medium_ptr_s3` config (timed in the sweeps); its last figures as a separate backend are in
docs/log.md.
"""

import argparse
import importlib
import os
import platform
import signal
import subprocess
import sys
import time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))

import requant.kernels as K  # noqa: E402
from benchmarks._qwen3_shapes import QWEN3  # noqa: E402
from benchmarks.bench_speed_report import markdown  # noqa: E402
from requant.io.output import write_bytes_atomic, write_json_atomic  # noqa: E402
from requant.kernels import cutlass as ck  # noqa: E402
from requant.kernels import reference as ref  # noqa: E402
from requant.kernels.bf16 import bitwise_equal  # noqa: E402
from requant.kernels.triton import scaled_mm as t_scaled_mm  # noqa: E402

MS_MAIN = [512, 2048, 8192]
MS_DECODE = [1, 16, 128]
SQUARE = 8192
QUANT_MS, QUANT_K = (1, 16, 512, 2048), 4096
LAYER_MODEL, LAYER_MS = "Qwen3-8B", (1, 16, 512)
CHECK_SHAPES = ((512, 6144, 2048), (300, 1000, 520))
ROTATE_BYTES = 256 << 20
REP_MS = 8.0
SMS = 132
DEV = "cuda"
CUTLASS = {"ok": True, "error": None}  # main() sets it: whether the extension is built


# ---- the Triton path as of commit 7b4df52 ----


def old_config_for(m: int, n: int) -> str:
    """kernels.triton.scaled_mm.config_for as of commit 7b4df52 (triton.cdiv and all)."""

    def fill(tiles):
        return tiles / (triton.cdiv(tiles, SMS) * SMS)

    if m <= 16:
        return "decode"
    if m <= 128:
        return "small"
    mid_tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    if m <= 1024:
        return "mid" if mid_tiles >= SMS else "small_s6"
    big = triton.cdiv(m, 128) * triton.cdiv(n, 256)
    if fill(big) * 1.1 < fill(mid_tiles):
        return "mid"
    if n >= 4096 and big >= 2 * SMS:
        return "large_persist"
    return "large"


def triton_before(a, w, s_a, s_w):
    fn = importlib.import_module("requant.kernels.triton").scaled_mm  # the registry, per call
    with torch.cuda.device(a.device):  # the former wrapper's device context
        return fn(a, w, s_a, s_w, config=old_config_for(a.shape[0], w.shape[0]), cached=False)


def quantize_before(x):
    # The former per-call check (bool(isfinite(x).all()): a device sync) and JIT launch.
    return importlib.import_module("requant.kernels.triton").quantize_activations(x, check=True, cached=False)


# ---- timing ----


def _copies(bytes_per_set):
    return max(1, min(64, -(-ROTATE_BYTES // bytes_per_set)))


def int8_sets(m, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    count = _copies(m * k + n * k + 2 * m * n)
    return [
        (
            torch.randint(-128, 128, (m, k), dtype=torch.int8, device=DEV, generator=g),
            torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV, generator=g),
            torch.rand(m, 1, device=DEV, generator=g) * 0.05 + 1e-4,
            torch.rand(n, 1, device=DEV, generator=g) * 0.01 + 1e-5,
        )
        for _ in range(count)
    ]


def bf16_sets(m, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    count = _copies(2 * (m * k + n * k + m * n))
    return [
        (
            torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16),
            torch.randn(n, k, device=DEV, generator=g).to(torch.bfloat16),
        )
        for _ in range(count)
    ]


class Timer:
    """Eager and graph timing of one list of calls (one per operand copy)."""

    def __init__(self, calls, graph=True):
        self.calls = calls
        for f in calls:  # compile, build, fill caches outside any capture
            f()
        torch.cuda.synchronize()
        self.graph = None
        self.error = None
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for f in calls:
                        f()
                g.replay()
                torch.cuda.synchronize()
                self.graph = g
            except Exception as e:  # noqa: BLE001 - recorded in the output, the point goes on
                self.error = f"graph capture failed: {type(e).__name__}: {e}"[:300]
        self.n_eager = self.n_graph = None

    def eager(self):
        """ms per call over one repetition of eager calls."""
        if self.n_eager is None:
            self.n_eager = len(self.calls)
            self.n_eager = max(len(self.calls), min(4000, int(REP_MS / max(self._eager(), 1e-4))))
        return self._eager()

    def _eager(self):
        calls, n = self.calls, self.n_eager
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(n):
            calls[i % len(calls)]()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n

    def graphed(self):
        if self.graph is None:
            return None
        if self.n_graph is None:
            self.n_graph = 1
            self.n_graph = max(1, min(2000, int(REP_MS / max(self._graph(), 1e-4))))
        return self._graph()

    def _graph(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(self.n_graph):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / (self.n_graph * len(self.calls))


def _summary(ms_list, ops):
    ms = sorted(ms_list)
    med = max(ms[len(ms) // 2], 1e-9)
    return {"ms": med, "tops": ops / med / 1e9, "spread": (ms[-1] - ms[0]) / med, "reps_ms": ms_list}


def run_interleaved(timers, ops, reps, modes):
    """{mode: {name: summary}} with repetition r of every timer before repetition r + 1."""
    raw = {mode: {name: [] for name in timers} for mode in modes}
    for _ in range(reps):
        for name, t in timers.items():
            if "eager" in modes:
                raw["eager"][name].append(t.eager())
            if "graph" in modes:
                v = t.graphed()
                if v is not None:
                    raw["graph"][name].append(v)
    return {mode: {name: _summary(v, ops) for name, v in per.items() if v} for mode, per in raw.items()}


def gpu_state():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.split("\n")[0]
        clock, power, temp = (float(x) for x in out.split(","))
        return {"clock_mhz": clock, "power_w": power, "temp_c": temp}
    except Exception:  # noqa: BLE001 - optional information
        return {}


# ---- the measured items ----


def point(m, n, k, reps, seed, with_before=True):
    sets = int8_sets(m, n, k, seed)
    fns = {
        "cutlass": lambda o: K.scaled_mm(*o, backend="cutlass"),
        "triton": lambda o: K.scaled_mm(*o, backend="triton"),
    }
    if not CUTLASS["ok"]:
        del fns["cutlass"]
    if with_before:
        fns["triton_before"] = lambda o: triton_before(*o)
    if m > 16:
        fns["int_mm"] = lambda o: torch._int_mm(o[0], o[1].t())
    timers, errors = {}, {}
    for name, fn in fns.items():
        try:
            timers[name] = Timer([lambda o=o, fn=fn: fn(o) for o in sets])
            if timers[name].error:
                errors[name] = timers[name].error
        except Exception as e:  # noqa: BLE001 - one backend failing must not stop the others
            errors[name] = f"{type(e).__name__}: {e}"[:300]
    bsets = bf16_sets(m, n, k, seed)
    timers["bf16"] = Timer([lambda b=b: torch.matmul(b[0], b[1].t()) for b in bsets])
    if timers["bf16"].error:
        errors["bf16"] = timers["bf16"].error
    state = gpu_state()
    res = run_interleaved(timers, 2.0 * m * n * k, reps, ("eager", "graph"))
    sel = {
        "cutlass": cutlass_selection(m, n, k),
        "triton": sys.modules["requant.kernels.triton.scaled_mm"].config_for(m, n),
        "triton_before": old_config_for(m, n),
    }
    out = dict(res, m=m, n=n, k=k, copies=len(sets), selected=sel, gpu=state, errors=errors)
    del timers, sets, bsets
    torch.cuda.empty_cache()
    return out


def cutlass_selection(m, n, k):
    """The default CUTLASS tile and swizzle for m x n x k, as 'name swS' (n/a without a build)."""
    if not CUTLASS["ok"]:
        return "n/a"
    ext = ck.build()
    tile = ext.default_tile(m, n)
    return f"{ck.TILES[tile]} sw{ext.default_swizzle(m, n, k, tile)}"


def sweep(m, n, k, variants, reps, seed):
    """Graph timing of named calls (tile choices) on one shape: {name: summary}."""
    sets = int8_sets(m, n, k, seed)
    timers, errors = {}, {}
    for name, fn in variants.items():
        try:
            timers[name] = Timer([lambda o=o, fn=fn: fn(*o) for o in sets])
            if timers[name].error:
                errors[name] = timers[name].error
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"[:300]
    res = run_interleaved(timers, 2.0 * m * n * k, reps, ("graph",))["graph"]
    del timers, sets
    torch.cuda.empty_cache()
    return {
        "m": m,
        "n": n,
        "k": k,
        "tops": {k_: v["tops"] for k_, v in res.items()},
        "spread": {k_: v["spread"] for k_, v in res.items()},
        "errors": errors,
        "gpu": gpu_state(),
    }


def cutlass_variants(names):
    if not CUTLASS["ok"]:
        return {}
    idx = {name: t for t, name in ck.TILES.items()}
    out = {}
    for spec in names:  # "medium:8" = tile medium, swizzle 8; "mid" = default swizzle
        tile, _, sw = spec.partition(":")
        out[f"cutlass:{spec}"] = lambda a, w, s_a, s_w, t=idx[tile], sw=(int(sw) if sw else None): ck.scaled_mm(
            a, w, s_a, s_w, tile=t, swizzle=sw
        )
    return out


def triton_variants(names):
    return {f"triton:{c}": (lambda a, w, s_a, s_w, c=c: t_scaled_mm(a, w, s_a, s_w, config=c)) for c in names}


def quantize_item(reps):
    res = {}
    for m in QUANT_MS:
        g = torch.Generator(device=DEV).manual_seed(m)
        xs = [torch.randn(m, QUANT_K, device=DEV, generator=g).to(torch.bfloat16) for _ in range(8)]
        timers = {
            "before": Timer([lambda x=x: quantize_before(x) for x in xs], graph=False),
            "after": Timer([lambda x=x: K.quantize_activations(x, backend="triton") for x in xs], graph=False),
        }
        r = run_interleaved(timers, 1.0, reps, ("eager",))["eager"]
        res[str(m)] = {name: {"us": v["ms"] * 1e3, "spread": v["spread"]} for name, v in r.items()}
    return res


def layer_item(m, reps, seed):
    """One Qwen3-8B decoder layer's Linears with their activation quantizations (4 quantizes,
    7 GEMMs), eager and as a graph, with each backend's path as of 7b4df52 (before) and now (after)."""
    lins = {lin: (n, k) for lin, n, k, _ in QWEN3[LAYER_MODEL]}
    g = torch.Generator(device=DEV).manual_seed(seed)
    per_layer = sum(n * k * c for _, n, k, c in QWEN3[LAYER_MODEL])
    layers = []
    for _ in range(_copies(per_layer)):
        ws = {}
        for name, lin in (
            ("q", "q,o"),
            ("k", "k,v"),
            ("v", "k,v"),
            ("o", "q,o"),
            ("gate", "gate,up"),
            ("up", "gate,up"),
            ("down", "down"),
        ):
            n, k = lins[lin]
            ws[name] = (
                torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV, generator=g),
                torch.rand(n, 1, device=DEV, generator=g) * 0.01 + 1e-5,
            )
        layers.append(ws)
    x = torch.randn(m, lins["q,o"][1], device=DEV, generator=g).to(torch.bfloat16)
    xi = torch.randn(m, lins["down"][1], device=DEV, generator=g).to(torch.bfloat16)

    def make(backend, before):
        gemm = (
            triton_before
            if (before and backend == "triton")
            else (lambda a, w, s_a, s_w: K.scaled_mm(a, w, s_a, s_w, backend=backend))
        )
        quant = quantize_before if before else (lambda t: K.quantize_activations(t, backend="triton"))

        def run(ws):
            a, s = quant(x)
            for name in ("q", "k", "v"):
                gemm(a, ws[name][0], s, ws[name][1])
            a, s = quant(x)
            gemm(a, ws["o"][0], s, ws["o"][1])
            a, s = quant(x)
            gemm(a, ws["gate"][0], s, ws["gate"][1])
            gemm(a, ws["up"][0], s, ws["up"][1])
            a, s = quant(xi)
            gemm(a, ws["down"][0], s, ws["down"][1])

        return [lambda ws=ws: run(ws) for ws in layers]  # noqa: F821 (layers: the enclosing function's)

    timers = {}
    for backend in ("cutlass", "triton") if CUTLASS["ok"] else ("triton",):
        for before in (True, False):
            label = f"{backend}:{'before' if before else 'after'}"
            timers[label] = Timer(make(backend, before), graph=not before)  # the old check syncs: no graph
    ops = 2.0 * m * sum(n * k * c for _, n, k, c in QWEN3[LAYER_MODEL])
    res = run_interleaved(timers, ops, reps, ("eager", "graph"))
    del timers, layers
    torch.cuda.empty_cache()
    return dict(res, m=m, copies=_copies(per_layer))


def checks():
    """The former path and both backends compute their emulated order bit for bit."""
    out = {}
    for m, n, k in CHECK_SHAPES:
        a, w, s_a, s_w = int8_sets(m, n, k, 7)[0]
        want = ref.scaled_mm_triton_order(a, w, s_a, s_w)
        out[f"triton_before {m}x{n}x{k}"] = bitwise_equal(triton_before(a, w, s_a, s_w), want)
        out[f"triton {m}x{n}x{k}"] = bitwise_equal(K.scaled_mm(a, w, s_a, s_w, backend="triton"), want)
        if CUTLASS["ok"]:
            out[f"cutlass {m}x{n}x{k}"] = bitwise_equal(
                K.scaled_mm(a, w, s_a, s_w, backend="cutlass"), ref.scaled_mm_cutlass_order(a, w, s_a, s_w)
            )
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--budget-s", type=float, default=330.0, help="stop starting new items after this long")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--models", default=",".join(QWEN3))
    p.add_argument("--no-cutlass", action="store_true", help="do not build or time CUTLASS (its build failed)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    # timeout(1) sends SIGTERM: end like the budget does (the finally below writes the Markdown)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if args.no_cutlass:
        CUTLASS.update(ok=False, error="--no-cutlass")
    else:
        try:
            ck.build()
        except Exception as e:  # noqa: BLE001 - the Triton/cuBLAS numbers are still worth having
            CUTLASS.update(ok=False, error=f"{type(e).__name__}: {e}"[:500])
    result = {
        "command": "python3 -m benchmarks.bench_speed " + " ".join(sys.argv[1:]),
        "commit": os.environ.get("REQUANT_COMMIT", "unknown"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "peak_tops": 1979,
        "peak_clock_mhz": 1830,
        "timing": "Each backend is timed two ways"
        + __doc__.split("Each backend is timed two ways")[1].split("Also:")[0].rstrip(),
        "cutlass_error": CUTLASS["error"],
        "checks": {},
        "points": {},
        "sweeps": {},
        "layers": {},
        "quantize": {},
        "skipped": [],
        "failed": {},
    }
    path = os.path.join(args.out, "bench_speed.json")
    models = args.models.split(",")

    def save():
        result["elapsed_s"] = time.time() - t0
        write_json_atomic(path, result)

    items = [("checks", lambda: result["checks"].update(checks()))]
    sq = SQUARE
    items.append(("8192^3", lambda: result["points"].__setitem__("8192^3", point(sq, sq, sq, args.reps, 1))))
    items.append(
        (
            "sweep 8192^3",
            lambda: result["sweeps"].__setitem__(
                "8192^3",
                sweep(
                    sq,
                    sq,
                    sq,
                    {
                        **cutlass_variants(
                            ["medium:1", "medium:4", "medium:8", "large:1", "large:4", "large:8", "mid:1"]
                        ),
                        **triton_variants(["medium_s3", "medium_ptr_s3", "medium", "large_persist", "large", "mid"]),
                    },
                    3,
                    2,
                ),
            ),
        )
    )
    qwen = [(model, lin, n, k, c) for model in models for lin, n, k, c in QWEN3[model]]

    def add_linear_points(ms):  # every distinct Qwen3 Linear at each M, one item each
        for m in ms:
            for model, lin, n, k, c in qwen:
                key = f"{model}|{lin}|{m}"
                items.append(
                    (
                        key,
                        lambda key=key, m=m, n=n, k=k, c=c, model=model, lin=lin: result["points"].__setitem__(
                            key, dict(point(m, n, k, args.reps, m + n + k), model=model, lin=lin, count=c)
                        ),
                    )
                )

    add_linear_points(MS_MAIN)
    for m in LAYER_MS:
        items.append(
            (
                f"layer {LAYER_MODEL} M={m}",
                lambda m=m: result["layers"].__setitem__(str(m), layer_item(m, args.reps, m)),
            )
        )
    items.append(("quantize", lambda: result["quantize"].update(quantize_item(args.reps))))
    add_linear_points(MS_DECODE)
    for m in MS_MAIN:
        if m == 512:
            variants = {
                **cutlass_variants(["small", "mid", "medium"]),
                **triton_variants(["small_s6", "mid", "medium_s3"]),
            }
        else:
            variants = {
                **cutlass_variants(["medium:1", "medium:8", "mid", "large:8"]),
                **triton_variants(["medium_s3", "mid", "large_persist", "medium_ptr_s3"]),
            }
        for model, lin, n, k, _c in qwen:
            key = f"{model}|{lin}|{m}"
            items.append(
                (
                    f"sweep {key}",
                    lambda key=key, m=m, n=n, k=k, v=variants: result["sweeps"].__setitem__(
                        key, sweep(m, n, k, v, 3, m + n)
                    ),
                )
            )
    items.append(
        ("8192^3 end", lambda: result["points"].__setitem__("8192^3 end", point(sq, sq, sq, 3, 1, with_before=False)))
    )

    done = 0  # items handled (run, failed or skipped); the rest are listed if the run is stopped
    try:
        for name, run in items:
            if time.time() - t0 > args.budget_s:
                result["skipped"].append(name)
                done += 1
                continue
            s = time.time()
            try:
                run()
                print(f"[{time.time() - t0:5.0f} s] {name} ({time.time() - s:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - go on with the next item, say so
                result["failed"][name] = f"{type(e).__name__}: {e}"[:500]
                print(f"[{time.time() - t0:5.0f} s] {name} FAILED: {result['failed'][name]}", flush=True)
                torch.cuda.empty_cache()
            done += 1
            save()
        result["stopped"] = "budget" if result["skipped"] else "finished"
    finally:
        if done < len(items):  # SIGTERM (timeout) or an error outside the items
            result["stopped"] = f"interrupted during {items[done][0]!r}"
            result["skipped"] += [name for name, _ in items[done:]]
        save()
        md = markdown(result)
        write_bytes_atomic(os.path.join(args.out, "bench_speed.md"), md.encode())
        print(md.split("<!-- summary -->")[-1].strip() if "<!-- summary -->" in md else md[-3000:], flush=True)


if __name__ == "__main__":
    main()
