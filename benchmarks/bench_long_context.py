"""Long contexts on the fast engine (split-KV attention at fixed boundaries), one H200.

    python3 -m benchmarks.bench_long_context --synthetic qwen3-8b --out DIR [--reps 5] [--no-transformers]
        [--parts paths,sweep,decode,prefill]
    python3 -m benchmarks.bench_long_context --smoke --out DIR     # CPU: TRITON_INTERPRET=1, tiny shapes

Measured (CUDA-synchronised perf_counter, median [min-max] of --reps after a warm-up), on random
W8A8 weights at the preset's shapes (benchmarks/_runtime_fast.py, random_model):
  * batch-1 decode tok/s with CUDA graphs at contexts 128, 4096, 16384 (--contexts): a prompt of
    that many random ids, then --steps greedy steps per repetition, the position reset to the
    context before each repetition (every repetition decodes at the same positions); the ratio
    to the first context (goals: 4096 >= 0.9x, 16384 >= 0.75x of 128);
  * prefill tok/s at 1 x 8192 and 1 x 32768 (--prefill; last logits only), and transformers'
    bf16 Qwen3ForCausalLM (SDPA) on the same shapes in the same process;
  * the attention kernel alone, decode-shaped and prefill-shaped at the production SPLIT, on each
    of its two paths (the fused fold and split + combine, forced), whether the two give the same
    bits, and which one the runtime's dispatch (attention.fold_path) picks ("paths");
  * prefill tok/s also with every attention launch on split + combine (FOLD_MIN_PROGRAMS above
    any launch): the fused fold's gain on the model ("requant_split_only");
  * the attention kernel alone, decode-shaped (1 token at each context) and prefill-shaped, at
    the production SPLIT and at every --split-sweep value, the path chosen by the dispatch (one split = the unsplit walk): the
    price of the fixed split against the best of the sweep at each shape (a free split); at a
    context within one split, whether the production output equals the unsplit one bit for bit.
  * ("fold", not in the default parts) the fused fold against split + combine on chunk-shaped
    launches: a chunk of n tokens (--fold-chunks) after p cached positions (--fold-prefixes), the
    launch's programs (blocks x KV heads), both paths' ms and bits; the FOLD_MIN_PROGRAMS it
    suggests: the least program count from which the fold is never slower (kernels/triton/attention.py's FOLD_MIN_PROGRAMS).
--parts picks what runs (default: paths, sweep, decode, prefill). JSON and Markdown under --out (bench_long_context.json, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from requant.io.markdown import table  # noqa: E402

UNSPLIT = 1 << 30  # one split at any context: the walk without splits


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median(v):
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _stats(work: float, secs: list[float]) -> dict:
    v = [work / s for s in secs]
    return {"median": _median(v), "min": min(v), "max": max(v)}


def _per_call(fn, reps: int, n: int) -> list[float]:
    fn()
    out = []
    for _ in range(reps):
        _sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        _sync()
        out.append((time.perf_counter() - t) / n)
    return out


def _random_bf16(device, seed: int):
    """bf(*shape): seeded N(0, 1) tensors in bf16 on `device`."""
    g = torch.Generator(device).manual_seed(seed)
    return lambda *shape: torch.randn(shape, generator=g, device=device).to(torch.bfloat16)


def _blocks(n: int, per: int, device) -> torch.Tensor:
    """The attention blocks of one sequence of n query tokens, `per` tokens each (cache row 0)."""
    return torch.tensor([(i, min(per, n - i), 0) for i in range(0, n, per)], dtype=torch.int32, device=device)


def attention_shapes(heads, kv, dim, contexts, prefill, device):
    """(name, q, k_cache, v_cache, pos, blocks) for decode at each context and prefill lengths."""
    from requant.kernels.triton.attention import tokens_per_block

    bf, per = _random_bf16(device, 0), tokens_per_block(heads, kv)
    out = []
    for n in sorted(set(contexts) | set(prefill)):
        cap = 1 << max(n - 1, 0).bit_length()
        kc, vc = bf(1, kv, cap, dim), bf(1, kv, cap, dim)
        if n in contexts:
            pos = torch.tensor([n - 1], dtype=torch.int32, device=device)
            blocks = torch.tensor([[0, 1, 0]], dtype=torch.int32, device=device)
            out.append((f"decode@{n}", bf(1, heads, dim), kc, vc, pos, blocks))
        if n in prefill:
            pos = torch.arange(n, dtype=torch.int32, device=device)
            out.append((f"prefill@{n}", bf(n, heads, dim), kc, vc, pos, _blocks(n, per, device)))
    return out


def split_prices(shapes, splits, reps: int, calls: int) -> dict:
    """ms per attention call at each SPLIT (module constant, restored after), per shape."""
    import requant.kernels.triton.attention as att

    production = att.SPLIT
    rows = {}
    try:
        for name, q, kc, vc, pos, blocks in shapes:
            row, outs = {}, {}
            for s in [production, *[x for x in splits if x != production]]:
                att.SPLIT = s
                secs = _per_call(lambda: att.attention(q, kc, vc, pos, blocks, q.shape[-1] ** -0.5), reps, calls)
                row["unsplit" if s == UNSPLIT else str(s)] = 1e3 * _median(secs)
                outs[s] = att.attention(q, kc, vc, pos, blocks, q.shape[-1] ** -0.5)
            best = min(row, key=row.get)
            row["fixed_over_best"] = row[str(production)] / row[best]
            row["best"] = best
            if UNSPLIT in outs and int(pos.max()) < production:  # one split: the unsplit walk's bits
                row["one_split_equals_unsplit"] = torch.equal(
                    outs[production].view(torch.int16), outs[UNSPLIT].view(torch.int16)
                )
            rows[name] = row
    finally:
        att.SPLIT = production
    return {"production_split": production, "ms": rows}


def chunk_shapes(heads, kv, dim, chunks, prefixes, device):
    """(name, q, k_cache, v_cache, pos, blocks) of a chunk of n tokens after p cached positions."""
    from requant.kernels.triton.attention import tokens_per_block

    bf, per = _random_bf16(device, 3), tokens_per_block(heads, kv)
    out = []
    for p in prefixes:
        for n in chunks:
            cap = 1 << max(p + n - 1, 0).bit_length()
            pos = torch.arange(p, p + n, dtype=torch.int32, device=device)
            q, kc, vc = bf(n, heads, dim), bf(1, kv, cap, dim), bf(1, kv, cap, dim)
            out.append((f"chunk {n}@{p}", q, kc, vc, pos, _blocks(n, per, device)))
    return out


def fold_threshold(rows: dict) -> int | None:
    """The least program count p such that the fold is no slower than split + combine on every
    measured launch of at least p programs (None: the fold loses on the largest launch)."""
    wins: dict[int, bool] = {}
    for r in rows.values():
        if r["eligible"]:
            wins[r["programs"]] = wins.get(r["programs"], True) and r["fold"] <= r["split"]
    best = None
    for programs in sorted(wins, reverse=True):
        if not wins[programs]:
            break
        best = programs
    return best


def path_prices(shapes, reps: int, calls: int) -> dict:
    """ms per attention call on each path at the production SPLIT, per shape; fold == split bitwise."""
    import requant.kernels.triton.attention as att

    rows = {}
    for name, q, kc, vc, pos, blocks in shapes:
        row, outs = {}, {}
        for path in ("split", "fold"):
            secs = _per_call(lambda: att.attention(q, kc, vc, pos, blocks, q.shape[-1] ** -0.5, path=path), reps, calls)
            row[path] = 1e3 * _median(secs)
            outs[path] = att.attention(q, kc, vc, pos, blocks, q.shape[-1] ** -0.5, path=path)
        row["split_over_fold"] = row["split"] / row["fold"]
        row["dispatch"] = "fold" if att.fold_path(q.shape[0], blocks.shape[0], kc.shape[1]) else "split"
        row["fold_equals_split"] = torch.equal(outs["fold"].view(torch.int16), outs["split"].view(torch.int16))
        row["programs"] = blocks.shape[0] * kc.shape[1]
        row["eligible"] = q.shape[0] > blocks.shape[0]  # fold_path's other condition: blocks of several tokens
        rows[name] = row
    rec = {"split": att.SPLIT, "fold_min_programs": att.FOLD_MIN_PROGRAMS, "ms": rows}
    rec["suggested_fold_min_programs"] = fold_threshold(rows)
    return rec


def decode_at_contexts(model, contexts, steps: int, reps: int) -> dict:
    from benchmarks._runtime_fast import requant_decoder

    out = {}
    g = torch.Generator().manual_seed(1)
    for ctx in contexts:
        prompt = torch.randint(0, model.arch.vocab, (ctx,), generator=g).to("cuda")
        dec = requant_decoder(model, [prompt], steps + 8, graphs=True)
        secs = []
        with torch.no_grad():
            for _ in range(reps):
                dec.pos[:1] = ctx
                _sync()
                t = time.perf_counter()
                for _ in range(steps):
                    dec.step()
                _sync()
                secs.append(time.perf_counter() - t)
        out[ctx] = {"tok_s": _stats(steps, secs), "ms_per_step": 1e3 * _median(secs) / steps}
        del dec
        model.impl.layout.decoders.clear()
        torch.cuda.empty_cache()
    first = out[contexts[0]]["tok_s"]["median"]
    for ctx in contexts:
        out[ctx]["vs_first_context"] = out[ctx]["tok_s"]["median"] / first
    return out


def prefill_lengths(model, hf, lengths, reps: int) -> dict:
    import requant.kernels.triton.attention as att
    from benchmarks._runtime_fast import hf_prefill, requant_prefill

    out = {}
    g = torch.Generator().manual_seed(2)
    for n in lengths:
        ids = torch.randint(0, model.arch.vocab, (n,), generator=g).to("cuda")
        row = {"requant": _stats(n, _per_call(lambda: requant_prefill(model, [ids]), reps, 1))}
        fold_min = att.FOLD_MIN_PROGRAMS
        att.FOLD_MIN_PROGRAMS = 1 << 62  # every launch on split + combine
        try:
            row["requant_split_only"] = _stats(n, _per_call(lambda: requant_prefill(model, [ids]), reps, 1))
        finally:
            att.FOLD_MIN_PROGRAMS = fold_min
        if hf is not None:
            row["transformers_bf16"] = _stats(n, _per_call(lambda: hf_prefill(hf, [ids]), reps, 1))
            row["ratio"] = row["requant"]["median"] / row["transformers_bf16"]["median"]
        out[n] = row
        torch.cuda.empty_cache()
    return out


def markdown(rec: dict) -> str:
    lines = [f"# Long contexts ({rec['shape']}, {rec['device']})", ""]
    if "decode" in rec:
        rows = [
            [
                ctx,
                f"{t['median']:.1f} [{t['min']:.1f}-{t['max']:.1f}]",
                f"{r['ms_per_step']:.3f}",
                f"{r['vs_first_context']:.2f}x",
            ]
            for ctx, r in rec["decode"].items()
            for t in (r["tok_s"],)
        ]
        header = ["decode batch 1, context", "tok/s (median [min-max])", "ms/step", "vs first"]
        lines += [*table(header, rows, align="rrrr"), ""]
    if "prefill" in rec:
        lines += [
            "| prefill 1 x n | requant tok/s | split + combine only | transformers bf16 tok/s | ratio |",
            "|---:|---:|---:|---:|---:|",
        ]
        for n, r in rec["prefill"].items():
            hf = r.get("transformers_bf16")
            so = f"{r['requant_split_only']['median']:.0f}"
            lines.append(
                f"| {n} | {r['requant']['median']:.0f} | {so} | {hf['median']:.0f} | {r['ratio']:.2f}x |"
                if hf
                else f"| {n} | {r['requant']['median']:.0f} | {so} | - | - |"
            )
        lines.append("")
    if "paths" in rec:
        pp = rec["paths"]
        lines += [
            f"Attention alone by path, ms per call (SPLIT {pp['split']}, FOLD_MIN_PROGRAMS {pp['fold_min_programs']}):",
            "",
            "| shape | split + combine | fused fold | split / fold | dispatch | fold == split, bitwise |",
            "|---|---:|---:|---:|---|---|",
        ]
        for name, r in pp["ms"].items():
            lines.append(
                f"| {name} | {r['split']:.4g} | {r['fold']:.4g} | {r['split_over_fold']:.2f}x | {r['dispatch']} "
                f"| {r['fold_equals_split']} |"
            )
        lines.append("")
    if "fold" in rec:
        fp = rec["fold"]
        lines += [
            f"Fused fold against split + combine on chunk launches (FOLD_MIN_PROGRAMS {fp['fold_min_programs']}; "
            f"suggested by this sweep: {fp['suggested_fold_min_programs']}):",
            "",
        ]
        cells = [
            [name, r["programs"], f"{r['split']:.4g}", f"{r['fold']:.4g}", f"{r['split_over_fold']:.2f}x", r["dispatch"],
             r["fold_equals_split"]]
            for name, r in fp["ms"].items()
        ]  # fmt: skip
        head = ["launch", "programs", "split + combine ms", "fold ms", "split / fold", "dispatch", "bits equal"]
        lines += [*table(head, cells, align="lrrrrll"), ""]
    if "split_prices" in rec:
        sp = rec["split_prices"]
        lines += [f"Attention alone, ms per call (production SPLIT {sp['production_split']}):", ""]
        for name, row in sp["ms"].items():
            cells = ", ".join(
                f"{k}: {v:.4g}" for k, v in row.items() if isinstance(v, float) and k != "fixed_over_best"
            )
            same = row.get("one_split_equals_unsplit")
            tail = "" if same is None else f"; one split == unsplit, bitwise: {same}"
            lines.append(f"- {name}: {cells}; fixed / best ({row['best']}) = {row['fixed_over_best']:.2f}{tail}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--synthetic", default="qwen3-8b", help="preset (requant.checkpoint.synthetic.PRESETS)")
    ap.add_argument("--backend", default="cutlass", help="GEMM backend of the fast engine")
    ap.add_argument("--contexts", default="128,4096,16384")
    ap.add_argument("--prefill", default="8192,32768")
    ap.add_argument("--split-sweep", default=f"128,256,512,1024,2048,{UNSPLIT}")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--parts", default="paths,sweep,decode,prefill", help="what to run (comma-separated; also fold)")
    ap.add_argument("--fold-chunks", default="16,32,64,128,256,512,1024,2048,4096")
    ap.add_argument("--fold-prefixes", default="0,4096")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter: the split sweep on tiny shapes only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = [int(x) for x in args.split_sweep.split(",")]
    parts = set(args.parts.split(","))
    if parts - {"paths", "sweep", "decode", "prefill", "fold"}:
        print(f"error: --parts {args.parts}: expected some of paths, sweep, decode, prefill, fold", file=sys.stderr)
        return 2
    try:
        chunks = [int(x) for x in args.fold_chunks.split(",")]
        prefixes = [int(x) for x in args.fold_prefixes.split(",")]
    except ValueError:
        print(f"error: --fold-chunks {args.fold_chunks} / --fold-prefixes {args.fold_prefixes}: expected integers",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.smoke:
        shapes = attention_shapes(4, 2, 16, [200], [130], "cpu")
        rec = {"shape": "smoke 4 heads / 2 KV / dim 16", "device": "cpu (TRITON_INTERPRET=1)"}
        if "paths" in parts:
            rec["paths"] = path_prices(shapes, reps=1, calls=1)
        if "sweep" in parts:
            rec["split_prices"] = split_prices(shapes, [64, 128, UNSPLIT], reps=1, calls=1)
        if "fold" in parts:
            rec["fold"] = path_prices(chunk_shapes(4, 2, 16, [8, 40, 100], [0, 520], "cpu"), reps=1, calls=1)
    else:
        if not torch.cuda.is_available():
            print("error: the benchmark needs CUDA (--smoke runs the CPU path)", file=sys.stderr)
            return 2
        from benchmarks._runtime_fast import hf_random, random_model

        contexts = [int(x) for x in args.contexts.split(",")]
        prefill = [int(x) for x in args.prefill.split(",")]
        model = random_model(args.synthetic, args.backend)
        a = model.arch
        rec = {"shape": args.synthetic, "device": torch.cuda.get_device_name(), "backend": args.backend}
        if parts & {"paths", "sweep"}:
            shapes = attention_shapes(a.heads, a.kv_heads, a.head_dim, contexts, prefill, "cuda")
            if "paths" in parts:
                rec["paths"] = path_prices(shapes, args.reps, calls=10)
            if "sweep" in parts:
                rec["split_prices"] = split_prices(shapes, sweep, args.reps, calls=10)
            del shapes
        if "fold" in parts:
            fold = chunk_shapes(a.heads, a.kv_heads, a.head_dim, chunks, prefixes, "cuda")
            rec["fold"] = path_prices(fold, args.reps, calls=10)
            del fold
        if "decode" in parts:
            rec["decode"] = decode_at_contexts(model, contexts, args.steps, args.reps)
        if "prefill" in parts:
            hf = None if args.no_transformers else hf_random(model)
            rec["prefill"] = prefill_lengths(model, hf, prefill, args.reps)
    (out / "bench_long_context.json").write_text(json.dumps(rec, indent=1, default=str))
    (out / "bench_long_context.md").write_text(markdown(rec))
    print(markdown(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
