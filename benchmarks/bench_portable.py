"""The price of the portable arithmetic on a GPU: the fast engine against the portable engine on the
same random W8A8 weights (bench_runtime_fast.random_model) at one shape (default Qwen3-8B):
prefill tokens/s at 1 x 2048 and 1 x 8192 (last logits only) and decode tokens/s at batch 1 and 64
(CUDA graphs, after a 128-token prompt), the median of --reps with the spread [min-max], engines
interleaved rep by rep. --profile also records where each engine's GPU time goes (torch.profiler,
the kernels by name, ms per call: eager decode steps at batch 1 and prefill 1 x 2048), so a price
above the goal names its kernels (the software exp2, the lane dot products).

    python3 benchmarks/bench_portable.py --out DIR [--synthetic qwen3-8b] [--backend cutlass] [--reps 3] [--profile]
        [--tokens none,2,4,8,16 --warps 4,8 --sweep-at 2048]   (the portable attention's prefill tiling, bits checked)

Writes DIR/bench_portable.json and .md. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from requant.io.markdown import table


def _sync():
    torch.cuda.synchronize()


def random_model(name: str, backend: str, device: str, engine: str, layers: int | None = None):
    """bench_runtime_fast.random_model's weights (random W8A8, made on `device`) on `engine`;
    layers: keep only the first ones (a quick CPU estimate)."""
    import dataclasses

    from benchmarks import _runtime_fast as bench_runtime_fast
    from requant.checkpoint.synthetic import PRESETS

    if layers is not None:
        PRESETS[f"{name}-{layers}l"] = dataclasses.replace(PRESETS[name], layers=layers)
        name = f"{name}-{layers}l"
    from requant.runtime import model as model_module

    saved = model_module.Model

    class _On(saved):  # random_model builds Model(..., engine="fast"): build it on `engine` instead
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "engine": engine})

    model_module.Model = _On
    try:
        m = bench_runtime_fast.random_model(name, backend, device=device)
    finally:
        model_module.Model = saved
    return m


def cpu_seconds_per_token(args) -> dict:
    """The portable engine's torch form on the CPU: prefill of 32 tokens, then decode steps."""
    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    m = random_model(args.synthetic, "reference-cutlass-order", "cpu", "portable", args.layers)
    built = time.perf_counter() - t
    prompt = torch.randint(0, m.arch.vocab, (32,), generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    m.generate([prompt], 1)  # the first call also makes the GEMM checks' vectors (once per weight)
    warm = time.perf_counter() - t
    dec = m.impl.decoder(1, 64, graphs=False)
    with torch.no_grad():
        t = time.perf_counter()
        logits = m.impl.prefill([prompt], cache=dec.cache, last_only=True)
        first = time.perf_counter() - t
        dec.start([len(prompt)])
        dec.tok[:1] = logits.argmax(-1)
        t = time.perf_counter()
        for _ in range(args.steps):
            dec.step()
        per = (time.perf_counter() - t) / args.steps
    return {
        "shape": args.synthetic,
        "layers": m.arch.layers,
        "threads": args.threads,
        "build_s": built,
        "first_call_s": warm,
        "prefill_32_s": first,
        "decode_s_per_token": per,
    }


def prefill_secs(model, n: int) -> float:
    ids = torch.randint(0, model.arch.vocab, (n,), generator=torch.Generator().manual_seed(n))
    _sync()
    t = time.perf_counter()
    with torch.no_grad():
        model.prefill([ids.cuda()], last_only=True)
    _sync()
    return time.perf_counter() - t


def decode_secs(model, batch: int, steps: int) -> float:
    from benchmarks._runtime_fast import requant_decoder

    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, model.arch.vocab, (128,), generator=g).cuda() for _ in range(batch)]
    dec = requant_decoder(model, prompts, steps + 4, graphs=True)
    _sync()
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            dec.step()
    _sync()
    secs = time.perf_counter() - t
    model.impl.layout.decoders.clear()
    return secs


def kernel_times(fn, calls: int = 3, top: int = 12) -> dict:
    """GPU ms per call of fn() by kernel name (the `top` largest, the rest summed as "other")."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        _sync()
    ms = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and not e.key.startswith("aten::"):
            ms[e.key[:80]] = ms.get(e.key[:80], 0.0) + us / 1e3 / calls
    ranked = sorted(ms.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:top])
    if len(ranked) > top:
        out["other"] = sum(v for _, v in ranked[top:])
    return out


def profiles(model) -> dict:
    """Where one engine's GPU time goes: an eager batch-1 decode step, a 1 x 2048 prefill."""
    from benchmarks._runtime_fast import requant_decoder

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.arch.vocab, (2048,), generator=g).cuda()
    dec = requant_decoder(model, [ids[:128]], 16, graphs=False)
    out = {
        "decode_b1_step": kernel_times(lambda: dec.step()),
        "prefill_2048": kernel_times(lambda: model.prefill([ids], last_only=True), calls=2),
    }
    model.impl.layout.decoders.clear()
    return out


def tokens_sweep(model, n: int, settings: list[tuple[int | None, int]], reps: int) -> list[dict]:
    """The portable engine's prefill 1 x n at each (PREFILL_TOKENS, WARPS) of its attention
    (kernels/triton/portable.py): median ms and spread, and whether the last logits have the bits of
    the first setting's (they must: a row's arithmetic never depends on its program's rows)."""
    from requant.kernels.triton import portable as tp

    ids = torch.randint(0, model.arch.vocab, (n,), generator=torch.Generator().manual_seed(n)).cuda()
    saved, out, first = (tp.PREFILL_TOKENS, tp.WARPS), [], None
    try:
        for tokens, warps in settings:
            tp.PREFILL_TOKENS, tp.WARPS = tokens, warps
            with torch.no_grad():  # the warm-up (compiles this setting) and its bits
                got = model.prefill([ids], last_only=True).float().cpu().view(torch.int32)
            first = got if first is None else first
            secs = [prefill_secs(model, n) for _ in range(reps)]
            row = {"tokens": tokens, "warps": warps, "ms": 1e3 * sorted(secs)[len(secs) // 2], **_spread(secs, n)}
            out.append({**row, "same_bits": bool(torch.equal(got, first))})
            print(f"prefill {n}, tokens {tokens}, warps {warps}: {out[-1]}", flush=True)
    finally:
        tp.PREFILL_TOKENS, tp.WARPS = saved
    return out


def _spread(secs: list[float], work: float) -> dict:
    """tokens/s at the median, min and max of the seconds (the min rate at the max time)."""
    s = sorted(secs)
    return {"tok_s": work / s[len(s) // 2], "tok_s_min": work / s[-1], "tok_s_max": work / s[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--synthetic", default="qwen3-8b")
    ap.add_argument("--backend", default="cutlass")
    ap.add_argument("--prefill", default="2048,8192")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also where each engine's GPU time goes, by kernel")
    ap.add_argument("--cpu", action="store_true", help="time the torch form on the CPU instead (seconds a token)")
    ap.add_argument("--layers", type=int, default=None, help="--cpu: only the first LAYERS layers")
    ap.add_argument("--threads", type=int, default=2, help="--cpu: torch threads")
    ap.add_argument(
        "--tokens",
        default=None,
        help="also sweep the portable attention's tokens per prefill program (e.g. none,2,4,8,16; none: "
        "today's default) at each --sweep-at length, the bits checked equal across settings",
    )
    ap.add_argument("--warps", default="4,8", help="--tokens: the warps swept with each")
    ap.add_argument("--sweep-at", default="2048", help="--tokens: the prefill lengths of the sweep")
    args = ap.parse_args(argv)
    if args.cpu:
        rec = cpu_seconds_per_token(args)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_portable_cpu.json").write_text(json.dumps(rec, indent=1))
        print(json.dumps(rec, indent=1))
        return 0
    if not torch.cuda.is_available():
        print("error: the benchmark needs CUDA", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fast = random_model(args.synthetic, args.backend, "cuda", "fast")
    engines = {"fast": fast, "portable": fast.with_backends(engine="portable")}
    rec = {
        "tool": "benchmarks/bench_portable.py",
        "commit": os.environ.get("REQUANT_COMMIT"),
        "device": torch.cuda.get_device_name(),
        "shape": args.synthetic,
        "backend": args.backend,
        "reps": args.reps,
        "prefill": {},
        "decode": {},
    }

    def flush():
        (out / "bench_portable.json").write_text(json.dumps(rec, indent=1))

    for n in [int(x) for x in args.prefill.split(",")]:
        for m in engines.values():
            prefill_secs(m, n)  # warm-up (compiles)
        secs = {k: [] for k in engines}
        for _ in range(args.reps):
            for k, m in engines.items():
                secs[k].append(prefill_secs(m, n))
        med = {k: sorted(v)[len(v) // 2] for k, v in secs.items()}
        rec["prefill"][n] = {k: {"ms": 1e3 * med[k], **_spread(secs[k], n)} for k in engines}
        rec["prefill"][n]["portable_over_fast_time"] = med["portable"] / med["fast"]
        print(f"prefill {n}: {rec['prefill'][n]}", flush=True)
        flush()
    for b in [int(x) for x in args.batches.split(",")]:
        secs = {k: [] for k in engines}
        for _ in range(args.reps):
            for k, m in engines.items():
                secs[k].append(decode_secs(m, b, args.steps))
        med = {k: sorted(v)[len(v) // 2] for k, v in secs.items()}
        rec["decode"][b] = {k: {"ms_per_step": 1e3 * med[k] / args.steps, **_spread(secs[k], b * args.steps)}
                            for k in engines}  # fmt: skip
        rec["decode"][b]["portable_over_fast_time"] = med["portable"] / med["fast"]
        print(f"decode batch {b}: {rec['decode'][b]}", flush=True)
        flush()
    if args.tokens:
        settings = [
            (None if t == "none" else int(t), int(w)) for t in args.tokens.split(",") for w in args.warps.split(",")
        ]
        rec["tokens_sweep"] = {}
        for n in [int(x) for x in args.sweep_at.split(",")]:
            rec["tokens_sweep"][n] = tokens_sweep(engines["portable"], n, settings, args.reps)
            flush()
    if args.profile:
        rec["profile"] = {k: profiles(m) for k, m in engines.items()}
        flush()
    (out / "bench_portable.md").write_text(markdown(rec))
    print(markdown(rec))
    return 0


def markdown(rec: dict) -> str:
    """The table (median tokens/s [min-max]) and, with --profile, the largest kernels per engine."""

    def cell(r, fmt):
        return f"{r['tok_s']:{fmt}} [{r['tok_s_min']:{fmt}}-{r['tok_s_max']:{fmt}}]"

    lines = [f"# fast vs portable, {rec['shape']}, {rec['backend']}, {rec['device']} (commit {rec['commit']})", ""]
    rows = [
        [f"prefill 1 x {n} (tok/s)", cell(r["fast"], ".0f"), cell(r["portable"], ".0f"),
         f"{r['portable_over_fast_time']:.2f}"]
        for n, r in rec["prefill"].items()
    ] + [
        [f"decode batch {b} (tok/s)", cell(r["fast"], ".1f"), cell(r["portable"], ".1f"),
         f"{r['portable_over_fast_time']:.2f}"]
        for b, r in rec["decode"].items()
    ]  # fmt: skip
    lines += table(["what (median [min-max] of reps)", "fast", "portable", "portable time / fast time"], rows)
    for n, rows in rec.get("tokens_sweep", {}).items():
        lines += ["", f"Portable prefill 1 x {n}, the attention's tokens per program and warps (median [min-max]):", ""]
        lines += table(
            ["tokens", "warps", "ms", "tok/s", "bits equal to the first row"],
            [
                [
                    r["tokens"] or "default",
                    r["warps"],
                    f"{r['ms']:.1f}",
                    cell(r, ".0f"),
                    "yes" if r["same_bits"] else "**NO**",
                ]
                for r in rows
            ],
        )
    for engine, prof in rec.get("profile", {}).items():
        for what, ms in prof.items():
            total = sum(ms.values())
            lines += ["", f"{engine}, {what}: {total:.3f} ms GPU: " + "; ".join(f"{k} {v:.3f}" for k, v in ms.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
