"""Runtime benchmark: prefill and decode speed of requant.runtime with each GEMM backend in
both regimes (native scales, pow2 = the nearest arm), against transformers' bf16
Qwen3ForCausalLM on the same (dequantized) weights; the pow2/native speed ratio with the
same kernel; and the determinism counts of `requant determinism` on the same models.

    python3 -m benchmarks.bench_runtime CKPT [CKPT ...] --out DIR          # GPU defaults
    python3 -m benchmarks.bench_runtime --device cpu --backends reference --out DIR \\
        --prefill 64,128 --batches 1,2 --new-tokens 4 --reps 1              # CPU smoke run

What is measured (every time CUDA-synchronised before and after, perf_counter):
  * prefill tokens/s: one prompt of N random ids (seeded), the forward pass with the
    last position's logits only (requant: Model.prefill(last_only=True); transformers:
    logits_to_keep=1), N in --prefill;
  * decode tokens/s: B prompts of --prompt-len random ids, prefilled (not timed), then
    --new-tokens - 1 greedy decode steps with the KV cache timed: B * (new_tokens - 1) /
    seconds, B in --batches (transformers: its DynamicCache, the same loop);
  * each configuration warmed up once (Triton compiles a kernel per shape on first use;
    decode warms up with two steps),
    then --reps repetitions; the variants of one configuration are interleaved rep by rep
    (cutlass native, cutlass pow2, triton native, triton pow2, transformers), so a clock
    drift hits all of them alike; reported: median and [min, max];
  * pow2/native ratio per backend and configuration: median pow2 tokens/s over median
    native tokens/s (the claim under test: 1.00);
  * determinism (requant.determinism.run_determinism, on the models already loaded):
    pair identical counts per regime and batch invariance, --det-prompts x --det-new-tokens.
requant runs eagerly (no CUDA graphs): every op is a launch, and today each
quantize_activations call checks its input for NaN/inf on the host (one device sync per
call). Activation quantization: --act-backend (default triton on CUDA, reference on CPU;
both give the same bits).
Writes DIR/bench_runtime.json (as it goes) and DIR/bench_runtime.md; progress on stderr.

--synthetic qwen3-1.7b,qwen3-8b runs the fast engine's benchmark instead (random weights made
on the GPU, no checkpoint; benchmarks/_runtime_fast.py says what it measures): prefill
1 x 2048 / 8 x 512 / mixed, decode with CUDA graphs and eagerly, transformers bf16 in the same
process, the invariance checks and the price of each invariance. Writes
DIR/bench_runtime_fast.json and .md.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from benchmarks._timing import Stopwatch, summary, sync, transformers_decode  # noqa: E402
from requant.io.markdown import table  # noqa: E402
from requant.io.output import write_bytes_atomic, write_json_atomic  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# -- requant ----------------------------------------------------------------------------------


def requant_prefill(model, ids: torch.Tensor) -> float:
    """Seconds for one prefill of ids (last position's logits)."""
    with Stopwatch(model.device) as sw, torch.no_grad():
        model.prefill([ids], last_only=True)
    return sw.seconds


def requant_decode(model, prompts: list[torch.Tensor], new_tokens: int) -> float:
    """Seconds for new_tokens - 1 decode steps after an untimed prefill of the batch."""
    cap = 1 << (max(len(p) for p in prompts) + new_tokens - 1).bit_length()
    with torch.no_grad():
        cache = model.new_cache(len(prompts), cap)
        nxt = model.prefill(prompts, cache=cache, last_only=True).argmax(-1)
        with Stopwatch(model.device) as sw:
            for _ in range(new_tokens - 1):
                nxt = model.decode_step(nxt, cache).argmax(-1)
    return sw.seconds


# -- transformers -----------------------------------------------------------------------------


def hf_model(ckpt, device):
    """transformers' Qwen3ForCausalLM in bf16 with the checkpoint's weights dequantized
    (q * s in fp32, then rounded to bf16), sdpa attention (its default)."""
    import transformers

    cfg = {k: v for k, v in ckpt.config.items() if k not in ("quantization_config", "requant")}
    config = transformers.Qwen3Config(**cfg)
    with torch.device(device):
        try:
            model = transformers.Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
        except TypeError:  # a transformers that still calls it torch_dtype
            model = transformers.Qwen3ForCausalLM._from_config(config, torch_dtype=torch.bfloat16).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in ckpt.tensor_names():
            if name.endswith(".weight_scale"):
                continue
            module = name[: -len(".weight")]
            if module in ckpt.quantized_linears:
                q, s = ckpt.weight_and_scale(module)
                w = q.to(device).to(torch.float32) * s.to(device).to(torch.float32)
            else:
                w = ckpt.tensor(name).to(device)
            if name in params:
                params[name].copy_(w.to(torch.bfloat16))
        if config.tie_word_embeddings:
            model.tie_weights()
    return model


def hf_prefill(model, ids: torch.Tensor) -> float:
    with Stopwatch(ids.device) as sw, torch.no_grad():
        model(input_ids=ids[None], logits_to_keep=1, use_cache=False)
    return sw.seconds


def hf_decode(model, prompts: list[torch.Tensor], new_tokens: int) -> float:
    """Seconds for new_tokens - 1 decode steps after an untimed prefill of the batch."""
    return transformers_decode(model, prompts, new_tokens - 1)


# -- one checkpoint -----------------------------------------------------------------------------


def bench_checkpoint(path: str, args, record: dict, flush) -> None:
    from requant.models.tokenizer import byte_ids_allowed

    with byte_ids_allowed():  # the synthetic Qwen3-shaped checkpoints have no tokenizer: byte ids, as their reports say
        _bench_checkpoint(path, args, record, flush)


def _bench_checkpoint(path: str, args, record: dict, flush) -> None:
    from requant.checkpoint import open_checkpoint
    from requant.determinism import run_determinism
    from requant.runtime import load_model

    dev = args.device
    ckpt = open_checkpoint(path)
    entry = {
        "checkpoint": str(ckpt.path),
        "name": Path(str(ckpt.path)).name,
        "config": {
            k: ckpt.config.get(k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
                "tie_word_embeddings",
            )
        },
        "quantized_linears": len(ckpt.quantized_linears),
        "rows": {},
        "timings": {},
    }
    record["checkpoints"].append(entry)
    t = time.perf_counter()
    log(f"{entry['name']}: loading native to {dev}")
    native = load_model(ckpt, regime="native", backend=args.backends[0], act_backend=args.act_backend, device=dev)
    sync(dev)
    entry["timings"]["load_native_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    log(f"{entry['name']}: pow2 (nearest arm, requantized in memory)")
    pow2 = load_model(
        ckpt, regime="pow2", backend=args.backends[0], act_backend=args.act_backend, device=dev, share=native
    )
    sync(dev)
    entry["timings"]["load_pow2_s"] = round(time.perf_counter() - t, 2)
    variants = {}
    for b in args.backends:
        variants[f"{b} native"] = ("requant", native.with_backends(b))
        variants[f"{b} pow2"] = ("requant", pow2.with_backends(b))
    hf = None
    if not args.no_transformers:
        t = time.perf_counter()
        log(f"{entry['name']}: transformers bf16 model")
        hf = hf_model(ckpt, dev)
        sync(dev)
        entry["timings"]["load_transformers_s"] = round(time.perf_counter() - t, 2)
        variants["transformers bf16"] = ("transformers", hf)
    vocab = native.arch.vocab
    gen = torch.Generator().manual_seed(0)
    configs = [("prefill", n) for n in args.prefill] + [("decode", b) for b in args.batches]
    results = {name: {} for name in variants}
    t_speed = time.perf_counter()
    for kind, n in configs:
        if kind == "prefill":
            if n > native.max_length:
                log(f"skip prefill {n}: max_length {native.max_length}")
                continue
            ids = torch.randint(0, vocab, (n,), generator=gen).to(dev)
            run = {"requant": lambda m: requant_prefill(m, ids), "transformers": lambda m: hf_prefill(m, ids)}
            warm = run
            work = n
        else:
            prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=gen).to(dev) for _ in range(n)]
            run = {
                "requant": lambda m: requant_decode(m, prompts, args.new_tokens),
                "transformers": lambda m: hf_decode(m, prompts, args.new_tokens),
            }
            # warm-up: two decode steps compile/load every kernel a step uses (same shapes)
            warm = {
                "requant": lambda m: requant_decode(m, prompts, 3),
                "transformers": lambda m: hf_decode(m, prompts, 3),
            }
            work = n * (args.new_tokens - 1)
        key = f"{kind} {n}"
        log(f"{entry['name']}: {key}: warm-up")
        for name, (engine, m) in variants.items():
            warm[engine](m)
        times = {name: [] for name in variants}
        for _rep in range(args.reps):
            for name, (engine, m) in variants.items():
                times[name].append(run[engine](m))
        for name in variants:
            results[name][key] = summary([work / s for s in times[name]])
        log(
            f"{entry['name']}: {key}: "
            + ", ".join(f"{name} {results[name][key]['median']:.0f} tok/s" for name in variants)
        )
        entry["rows"] = results
        flush()
    entry["timings"]["speed_s"] = round(time.perf_counter() - t_speed, 2)
    entry["pow2_over_native"] = {
        b: {
            key: results[f"{b} pow2"][key]["median"] / results[f"{b} native"][key]["median"]
            for key in results[f"{b} native"]
        }
        for b in args.backends
    }
    flush()
    del variants
    if hf is not None:
        del hf
        gc.collect()
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()
    if args.det_prompts:
        t = time.perf_counter()
        log(
            f"{entry['name']}: determinism, {args.det_prompts} prompts x {args.det_new_tokens} tokens, {args.backends[0]} vs {args.backends[1]}"
        )
        det = run_determinism(
            ckpt,
            tuple(args.backends),
            args.det_prompts,
            args.det_new_tokens,
            dev,
            act_backend=args.act_backend,
            models={"native": native, "pow2": pow2},
        )
        entry["determinism"] = {
            "summary": det["summary"],
            "ok": det["ok"],
            "tokenizer": det["tokenizer"],
            "regimes": {
                r: {
                    "identical": v["identical"],
                    "total": v["total"],
                    "first_divergence": [p["first_divergence"] for p in v["prompts"]],
                }
                for r, v in det["regimes"].items()
            },
            "batch_invariance": det["batch_invariance"],
            "batch_invariant": det["batch_invariant"],
            "new_tokens": args.det_new_tokens,
        }
        entry["timings"]["determinism_s"] = round(time.perf_counter() - t, 2)
        log(f"{entry['name']}: {det['summary']}; batch-invariant: {det['batch_invariant']}")
        flush()


def markdown(record: dict) -> str:
    lines = [
        "# requant runtime benchmark",
        "",
        "```bash",
        record["command"],
        "```",
        "",
        f"- device: {record['environment'].get('gpu') or record['environment'].get('cpu')}; torch {record['environment']['torch']}; "
        f"backends {', '.join(record['settings']['backends'])}; activations {record['settings']['act_backend']}",
        f"- prefill: one prompt of N tokens, last logits only; decode: B prompts of {record['settings']['prompt_len']} tokens, "
        f"{record['settings']['new_tokens'] - 1} timed greedy steps with the KV cache; tokens/s, median of "
        f"{record['settings']['reps']} [min-max] after a warm-up; eager (no CUDA graphs)",
        "",
    ]
    for e in record["checkpoints"]:
        lines += [f"## {e['name']}", "", f"`{e['checkpoint']}`: {e['config']}; timings {e['timings']}", ""]
        rows = e.get("rows") or {}
        keys = list(next(iter(rows.values()), {}).keys())
        if keys:
            cells = [
                [name, *(f"{r[k]['median']:.0f} [{r[k]['min']:.0f}-{r[k]['max']:.0f}]" for k in keys)]
                for name, r in rows.items()
            ]
            lines += [*table(["engine", *(f"{k} tok/s" for k in keys)], cells, align="l" + "r" * len(keys)), ""]
        if e.get("pow2_over_native"):
            lines += [
                "pow2 / native tokens/s, same kernel (the claim: 1.00):",
                "",
            ]
            cells = [[b, *(f"{r[k]:.3f}" for k in keys)] for b, r in e["pow2_over_native"].items()]
            lines += [*table(["backend", *keys], cells, align="l" + "r" * len(keys)), ""]
        if e.get("determinism"):
            d = e["determinism"]
            lines += [
                f"Determinism ({d['new_tokens']} new tokens): **{d['summary']}**; batch-invariant (each prompt alone "
                f"vs in the batch, every regime and backend): **{'yes' if d['batch_invariant'] else 'NO'}**",
                "",
            ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="W8A8 checkpoint directories (default: the embedded default)")
    ap.add_argument("--out", required=True, help="directory for bench_runtime.json and bench_runtime.md")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--backends", default=None, help="'cutlass,triton' (GPU default) or 'reference' (the emulated pair)"
    )
    ap.add_argument(
        "--act-backend", default=None, help="quantize_activations backend (default: triton on CUDA, reference on CPU)"
    )
    ap.add_argument("--prefill", default="512,2048", help="prefill lengths")
    ap.add_argument("--batches", default="1,8,64", help="decode batch sizes")
    ap.add_argument("--prompt-len", type=int, default=16, help="decode prompt length (random ids)")
    ap.add_argument(
        "--new-tokens", type=int, default=32, help="new tokens per decode run (the first comes from the prefill)"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--det-prompts", type=int, default=8, help="determinism prompts (0 = skip)")
    ap.add_argument("--det-new-tokens", type=int, default=32)
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers bf16 baseline")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU)")
    ap.add_argument("--synthetic", default=None, help="fast-engine benchmark on random GPU weights of these presets")
    ap.add_argument("--steps", type=int, default=32, help="--synthetic: timed decode steps")
    ap.add_argument(
        "--hbm", type=float, default=4.8e12, help="--synthetic: HBM bytes/s for the weight-read bound (H200)"
    )
    ap.add_argument("--reference", action="store_true", help="--synthetic: also time the reference engine (before)")
    ap.add_argument("--no-invariance", action="store_true", help="--synthetic: skip the invariance checks")
    args = ap.parse_args(argv)
    if args.synthetic:
        return main_synthetic(args, argv)

    from requant import DEFAULT_CHECKPOINT
    from requant.backends import environment, parse_backends

    cuda = args.device.startswith("cuda")
    args.backends = list(parse_backends(args.backends or ("cutlass,triton" if cuda else "reference")))
    args.act_backend = args.act_backend or ("triton" if cuda else "reference")
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    args.batches = [int(x) for x in args.batches.split(",") if x]
    if args.new_tokens < 2:
        ap.error("--new-tokens must be at least 2 (one prefill token, at least one decode step)")
    if not cuda:
        torch.set_num_threads(args.threads or 1)
    ckpts = args.checkpoints or [str(DEFAULT_CHECKPOINT)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "tool": "benchmarks/bench_runtime.py",
        "command": " ".join(["python3", "benchmarks/bench_runtime.py"] + (argv or sys.argv[1:])),
        "commit": os.environ.get("REQUANT_COMMIT"),
        "environment": environment(args.device),
        "settings": {
            k: getattr(args, k)
            for k in (
                "backends",
                "act_backend",
                "prefill",
                "batches",
                "prompt_len",
                "new_tokens",
                "reps",
                "det_prompts",
                "det_new_tokens",
                "device",
            )
        },
        "checkpoints": [],
    }

    def flush():
        write_json_atomic(out / "bench_runtime.json", record)

    if cuda and "cutlass" in args.backends:
        t = time.perf_counter()
        log("building/loading the CUTLASS extension")
        from requant.kernels import cutlass

        cutlass.build()
        record["cutlass_build_s"] = round(time.perf_counter() - t, 2)
    for path in ckpts:
        bench_checkpoint(path, args, record, flush)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    record["wall_seconds"] = round(time.perf_counter() - T0, 2)
    flush()
    write_bytes_atomic(out / "bench_runtime.md", markdown(record).encode())
    print(markdown(record))
    return 0


def main_synthetic(args, argv) -> int:
    from benchmarks import _runtime_fast as fast
    from requant.backends import environment, parse_backends

    args.backends = list(parse_backends(args.backends or "cutlass,triton"))
    args.invariance = not args.no_invariance
    args.batches = [int(x) for x in args.batches.split(",") if x]
    if args.prompt_len == 16:
        args.prompt_len = 128
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "tool": "benchmarks/bench_runtime.py --synthetic",
        "command": " ".join(["python3", "benchmarks/bench_runtime.py"] + (argv or sys.argv[1:])),
        "commit": os.environ.get("REQUANT_COMMIT"),
        "environment": environment("cuda"),
        "settings": {k: getattr(args, k) for k in ("backends", "batches", "prompt_len", "steps", "reps", "hbm")},
        "shapes": [],
    }

    def flush():
        write_json_atomic(out / "bench_runtime_fast.json", record)

    if "cutlass" in args.backends:
        t = time.perf_counter()
        from requant.kernels import cutlass

        cutlass.build()
        record["cutlass_build_s"] = round(time.perf_counter() - t, 2)
    if len(args.backends) > 1 and not args.no_invariance:
        record["determinism_default"] = fast._guard(fast.users, args.backends)
        log(f"requant determinism on the default, per engine: {record['determinism_default']}")
        flush()
    for name in args.synthetic.split(","):
        t = time.perf_counter()
        record["shapes"].append(fast.bench_shape(name, args, log))
        record["shapes"][-1]["seconds"] = round(time.perf_counter() - t, 1)
        flush()
        gc.collect()
        torch.cuda.empty_cache()
    record["wall_seconds"] = round(time.perf_counter() - T0, 2)
    flush()
    write_bytes_atomic(out / "bench_runtime_fast.md", fast.markdown(record).encode())
    print(fast.markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
