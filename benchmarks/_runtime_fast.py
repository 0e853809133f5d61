"""The fast engine's benchmark (bench_runtime.py --synthetic runs it): speed of
requant.runtime's fast engine against transformers' bf16 Qwen3ForCausalLM (SDPA) in the same
process, the invariance checks bit for bit, and the price of each invariance.

    python3 -m benchmarks.bench_runtime --synthetic qwen3-1.7b,qwen3-8b --out DIR

Models: random weights built directly on the GPU at the real Qwen3 shapes (no checkpoint on
disk: generating an 8B checkpoint takes minutes of CPU): int8 weights uniform in [-127, 127]
with the power-of-two scale 2**-12 (std ~0.02, the synthetic checkpoints' std), ones for the
norms, N(0, 0.02) embeddings and lm_head; transformers' model is its own random init in bf16
(speed only: the weights do not change its kernels). Parity on trained weights is a GPU test
(tests/requant/runtime/test_fast_gpu.py).

What is measured (CUDA-synchronised, perf_counter, median of --reps [min-max] after a warm-up):
  * prefill tokens/s: 1 x 2048, 8 x 512, 8 mixed lengths (sum 4224; transformers: one padded
    batch with an attention mask); requant Model.prefill(last_only=True), transformers
    logits_to_keep=1; both count real tokens only;
  * decode tokens/s: B prompts of --prompt-len random ids prefilled (not timed), then --steps
    greedy steps timed; requant with CUDA graphs and eagerly (the same kernels), transformers
    with its DynamicCache; B in --batches;
  * decode GPU time per step by kernel family (torch.profiler, eager steps) and the weight-read
    bound (bytes of weights read per step / --hbm bytes/s);
  * invariance, bitwise (requant.runtime.invariance): graph == eager (ids and logits), prefill ==
    chunks (1, 3, 7) after a cached prefix == decode, alone == in a batch of mixed lengths,
    cutlass == triton;
  * the price of invariance: graph vs eager; the fixed-tile lm_head vs cuBLAS (torch.matmul,
    free tile/split); our attention (fixed tile walk from position 0) vs torch SDPA (flash,
    free split); the tree-sum RMSNorm kernel vs torch's rms_norm.
"""

from __future__ import annotations

import time

import torch

from benchmarks._timing import Stopwatch, median_ms, per_call, rates, repeat, sync, transformers_decode
from requant.io.markdown import table
from requant.regime import REGIMES

GPU = "cuda"  # every timer synchronises this device


def _guard(fn, *args):
    """fn(*args), or {"error": ...}: a failing section is recorded and the benchmark goes on."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (recorded in the results, never hidden)
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


# -- models -----------------------------------------------------------------------------------


def random_model(name: str, backend: str, device: str = "cuda"):
    """A requant Model (fast engine) with random W8A8 weights made on the GPU."""
    from requant.checkpoint.synthetic import PRESETS, model_config
    from requant.runtime.model import Model

    p = PRESETS[name]
    cfg = model_config(p, quantized=True)
    g = torch.Generator(device).manual_seed(0)

    def normal(*shape):
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)

    dense = {
        "model.embed_tokens.weight": normal(p.vocab, p.hidden),
        "model.norm.weight": torch.ones(p.hidden, dtype=torch.bfloat16, device=device),
    }
    dense["lm_head.weight"] = dense["model.embed_tokens.weight"] if p.tie else normal(p.vocab, p.hidden)
    linears = {}
    for i in range(p.layers):
        pre = f"model.layers.{i}."
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            dense[pre + n] = torch.ones(p.hidden, dtype=torch.bfloat16, device=device)
        for n in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            dense[pre + n] = torch.ones(p.head_dim, dtype=torch.bfloat16, device=device)
        for leaf, (out, inp) in p.layer_linear_shapes().items():
            w = torch.randint(-127, 128, (out, inp), generator=g, device=device, dtype=torch.int8)
            linears[pre + leaf] = (
                w,
                torch.full((out, 1), 2.0**-12, dtype=torch.float32, device=device),
            )
    return Model(
        cfg,
        dense,
        linears,
        backend=backend,
        act_backend="triton",
        regime="pow2",
        engine="fast",
    )


def hf_random(model):
    import transformers

    cfg = {k: v for k, v in model.config.items() if k != "quantization_config"}
    config = transformers.Qwen3Config(**cfg, attn_implementation="sdpa")
    with torch.device("cuda"):
        try:
            hf = transformers.Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
        except TypeError:
            hf = transformers.Qwen3ForCausalLM._from_config(config, torch_dtype=torch.bfloat16).eval()
    return hf


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every int8 Linear and its scales, the lm_head."""
    fw = model.impl.layout
    n = sum(t.numel() * t.element_size() for w in fw.layers for k in ("qkv", "o", "gu", "down") for t in w[k])
    lm = fw.lm_head
    n += sum(t.numel() * t.element_size() for t in lm) if fw.lm_quantized else lm.numel() * lm.element_size()
    return n


# -- prefill and decode -------------------------------------------------------------------------

PREFILL = {
    "1x2048": [2048],
    "8x512": [512] * 8,
    "mixed": [1024, 768, 512, 384, 256, 512, 640, 128],
}


def requant_prefill(model, prompts):
    with torch.no_grad():
        model.prefill(prompts, last_only=True)


def hf_prefill(hf, prompts):
    n = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), n, dtype=torch.long, device="cuda")
    mask = torch.zeros(len(prompts), n, dtype=torch.long, device="cuda")
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
        mask[i, : len(p)] = 1
    with torch.no_grad():
        if all(len(p) == n for p in prompts):
            hf(input_ids=ids, logits_to_keep=1, use_cache=False)
        else:
            hf(input_ids=ids, attention_mask=mask, logits_to_keep=1, use_cache=False)


def requant_decoder(model, prompts, steps: int, graphs: bool):
    """A primed decoder: prompts prefilled into its cache, first step run (and captured)."""
    from requant.runtime.cache import pow2_at_least

    fw = model.impl
    b = len(prompts)
    cap = pow2_at_least(max(len(p) for p in prompts) + steps + 8)
    dec = fw.decoder(b, cap, graphs)
    with torch.no_grad():
        logits = fw.prefill(prompts, cache=dec.cache, last_only=True)
        dec.start([len(p) for p in prompts])
        dec.tok[:b] = logits.argmax(-1)
        dec.step()
        dec.step()  # eager first step, then the capture (graphs) and one replay
    return dec


def requant_decode_secs(model, prompts, steps: int, graphs: bool) -> float:
    dec = requant_decoder(model, prompts, steps, graphs)
    with Stopwatch(GPU) as sw, torch.no_grad():
        for _ in range(steps):
            dec.step()
    return sw.seconds


def _families(prof, calls: int) -> dict:
    """GPU ms per call by kernel family from a torch.profiler run of `calls` calls."""
    fam: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if not us or e.key.startswith("aten::"):  # CPU-side op entries, not kernels
            continue
        k = e.key
        name = (
            "int8 GEMM (cutlass)"
            if "cutlass" in k.lower() or "w8a8" in k.lower()
            else "int8 GEMM (triton)"
            if "scaled_mm" in k
            else "attention"
            if "attention" in k
            else "lm_head (dense)"
            if "dense" in k
            else "residual+RMSNorm+quant"
            if "add_rms_norm" in k
            else "q/k norm+RoPE+cache"
            if "qk_norm_rope" in k
            else "SiLU*up+quant"
            if "silu" in k
            else "quantize (o_proj input)"
            if "quantize" in k
            else "other"
        )
        fam[name] = fam.get(name, 0.0) + us / 1e3 / calls
    return dict(sorted(fam.items(), key=lambda kv: -kv[1]))


def decode_profile(model, prompts, steps: int = 4) -> dict:
    """GPU ms per eager decode step by kernel family."""
    from torch.profiler import ProfilerActivity, profile

    dec = requant_decoder(model, prompts, steps + 4, graphs=False)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec.step()
        sync(GPU)
    return _families(prof, steps)


def prefill_profile(model, prompts, calls: int = 2) -> dict:
    """GPU ms per prefill (last logits only) by kernel family."""
    from torch.profiler import ProfilerActivity, profile

    requant_prefill(model, prompts)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            requant_prefill(model, prompts)
        sync(GPU)
    return _families(prof, calls)


# -- invariance -----------------------------------------------------------------------------------


def invariance(model, other_backend: str | None, vocab: int) -> dict:
    """requant.runtime.invariance.check on 8 random prompts (32 new tokens; 3 also alone) and a
    400-token sequence (a 100-token prefix, chunks of 1, 3, 7 x 10, then decode steps), the other
    backend over 64 tokens; the counts of identical positions, prompts and steps, and where the first
    difference is (null when none)."""
    from requant.runtime import invariance as inv

    g = torch.Generator().manual_seed(7)
    lens = [37, 200, 5, 64, 129, 90, 1, 300]
    prompts = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    seq = torch.randint(0, vocab, (400,), generator=g)
    v = inv.check(model, prompts, seq, inv.pieces(400, 100, (1, 3, 7) * 10), 512, 32, range(3), other_backend, 64)
    ge, pcd, abp, abd = (
        v[k] for k in ("graph_vs_eager", "prefill_chunks_decode", "alone_vs_batch_prefill", "alone_vs_batch_decode")
    )
    out = {
        "graph_vs_eager": {
            "ids_identical": ge.ids[0] == ge.ids[1],
            "steps": ge.compared,
            "logits_identical": ge.identical,
            "first_difference": ge.first,
        },
        "prefill_chunks_decode": {"positions": pcd.compared, "identical": pcd.identical, "first_difference": pcd.first},
        "alone_vs_batch_prefill": {"prompts": abp.compared, "identical": abp.identical, "first_difference": abp.first},
        "alone_vs_batch_decode": {"prompts": abd.compared, "identical": abd.identical, "first_difference": abd.first},
    }
    if other_backend:
        name = f"{model.backend}_vs_{other_backend}"
        gen, pre = v["other_backend"], v["other_backend_prefill"]
        out[name] = {
            "prompts": len(prompts),
            "ids_identical": gen.ids[0],
            "new_tokens": 64,
            "step_logits_identical": gen.identical,
            "prefill_logits_identical": pre.identical,
            "first_difference": gen.first or pre.first,
        }
    return out


# -- price of invariance ---------------------------------------------------------------------------


def prices(model, reps: int) -> dict:
    from requant.kernels.triton.attention import attention, tokens_per_block
    from requant.kernels.triton.dense import dense
    from requant.kernels.triton.fused import add_rms_norm

    a = model.arch
    fw = model.impl.layout
    out = {}
    w = fw.lm_head if not fw.lm_quantized else None
    if w is not None:
        rows = {}
        for m in (1, 64, 2048):
            x = torch.randn(m, a.hidden, device="cuda").to(torch.bfloat16)
            fixed = per_call(lambda x=x: dense(x, w), reps, device=GPU)
            free = per_call(lambda x=x: torch.matmul(x, w.T), reps, device=GPU)
            rows[m] = {"fixed_tile_ms": median_ms(fixed), "cublas_bf16_ms": median_ms(free)}
        out["lm_head"] = rows
    t = 2048
    q = torch.randn(t, a.heads, a.head_dim, device="cuda").to(torch.bfloat16)
    kc = torch.randn(1, a.kv_heads, t, a.head_dim, device="cuda").to(torch.bfloat16)
    vc = torch.randn_like(kc)
    pos = torch.arange(t, dtype=torch.int32, device="cuda")
    per = tokens_per_block(a.heads, a.kv_heads)
    blocks = torch.tensor(
        [(i, min(per, t - i), 0) for i in range(0, t, per)],
        dtype=torch.int32,
        device="cuda",
    )
    ours = per_call(lambda: attention(q, kc, vc, pos, blocks, a.head_dim**-0.5), reps, device=GPU)
    qh = q.transpose(0, 1)[None]
    kh, vh = kc, vc
    sdpa = per_call(
        lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True),
        reps,
        device=GPU,
    )
    out["attention_2048"] = {"ours_ms": median_ms(ours), "sdpa_ms": median_ms(sdpa)}
    sweep = {}
    g = a.heads // a.kv_heads
    for tile in ((64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2)):
        per_t = tile[0] // g
        blk = torch.tensor(
            [(i, min(per_t, t - i), 0) for i in range(0, t, per_t)],
            dtype=torch.int32,
            device="cuda",
        )
        try:
            attention(q, kc, vc, pos, blk, a.head_dim**-0.5, tile=tile)
            sweep[str(tile)] = median_ms(
                per_call(
                    lambda blk=blk, tile=tile: attention(q, kc, vc, pos, blk, a.head_dim**-0.5, tile=tile),
                    reps,
                    device=GPU,
                )
            )
        except Exception as exc:  # noqa: BLE001 (a tile that does not compile: shared memory)
            sweep[str(tile)] = f"failed: {type(exc).__name__}"
    out["attention_2048"]["other_tiles_ms (BLOCK_M, BLOCK_N, warps, stages)"] = sweep
    x = torch.randn(t, a.hidden, device="cuda").to(torch.bfloat16)
    nw = torch.ones(a.hidden, dtype=torch.bfloat16, device="cuda")
    tree = per_call(lambda: add_rms_norm(x, nw, a.eps, quantize=False, write_h=True), reps, device=GPU)
    free = per_call(lambda: torch.nn.functional.rms_norm(x, (a.hidden,), nw, a.eps), reps, device=GPU)
    out["rms_norm_2048"] = {"tree_kernel_ms": median_ms(tree), "torch_rms_norm_ms": median_ms(free)}
    return out


def users(backends) -> dict:
    """`requant determinism`'s measurement (requant.determinism.run_determinism: 8 prompts x 64
    tokens, both regimes, both backends, batch and alone) on the embedded default, with the
    models loaded on each engine: wall seconds and the verdicts."""
    from requant import DEFAULT_CHECKPOINT
    from requant.checkpoint import open_checkpoint
    from requant.determinism import run_determinism
    from requant.runtime import load_model

    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    out = {}
    for engine in ("reference", "fast", "fast (again, warm)"):
        eng = engine.split()[0]
        models = {
            r: load_model(
                ckpt,
                regime=r,
                backend=backends[0],
                act_backend="triton",
                device="cuda",
                engine=eng,
            )
            for r in REGIMES
        }
        t = time.perf_counter()
        det = run_determinism(ckpt, tuple(backends), 8, 64, "cuda", act_backend="triton", models=models)
        out[engine] = {
            "seconds": round(time.perf_counter() - t, 2),
            "summary": det["summary"],
            "batch_invariant": det["batch_invariant"],
        }
    return out


# -- one shape -------------------------------------------------------------------------------------


def bench_shape(name: str, args, log) -> dict:
    import gc

    entry = {
        "shape": name,
        "rows": {},
        "decode_profile": {},
        "profile_backend": args.backends[0],
    }
    base = random_model(name, args.backends[0])
    assert base.engine == "fast"  # the stacked weights, built at load, shared by the other backend's copy
    models = {
        args.backends[0]: base,
        **{b: base.with_backends(b) for b in args.backends[1:]},
    }
    a = base.arch
    entry["config"] = {
        "hidden": a.hidden,
        "intermediate": a.intermediate,
        "layers": a.layers,
        "heads": a.heads,
        "kv_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab": a.vocab,
    }
    wb = weight_bytes(base)
    entry["weight_bytes_per_step"] = wb
    entry["weight_read_bound_ms"] = 1e3 * wb / args.hbm
    hf = None if args.no_transformers else hf_random(base)
    g = torch.Generator().manual_seed(0)
    rows = entry["rows"]
    for key, lens in PREFILL.items():
        prompts = [torch.randint(0, a.vocab, (n,), generator=g).cuda() for n in lens]
        work = sum(lens)
        variants = {f"requant fast {b}": (lambda m=m, p=prompts: requant_prefill(m, p)) for b, m in models.items()}
        if key == "1x2048" and args.reference:
            ref = base.with_backends(engine="reference")
            variants["requant reference (before)"] = lambda r=ref, p=prompts: requant_prefill(r, p)
        if hf is not None:
            variants["transformers bf16"] = lambda h=hf, p=prompts: hf_prefill(h, p)
        for fn in variants.values():
            fn()
        times = {k: [] for k in variants}
        for _ in range(args.reps):
            for k, fn in variants.items():
                times[k] += repeat(fn, 1, GPU)
        for k in variants:
            rows.setdefault(k, {})[f"prefill {key}"] = rates(work, times[k])
        log(f"{name} prefill {key}: " + ", ".join(f"{k} {rows[k][f'prefill {key}']['median']:.0f}" for k in variants))
        if key in ("1x2048", "8x512"):
            entry.setdefault("prefill_profile", {})[key] = _guard(prefill_profile, base, prompts)
    for bsz in args.batches:
        prompts = [torch.randint(0, a.vocab, (args.prompt_len,), generator=g).cuda() for _ in range(bsz)]
        work = bsz * args.steps
        for b, m in models.items():
            for graphs in (True, False):
                k = f"requant fast {b} {'graph' if graphs else 'eager'}"
                secs = [requant_decode_secs(m, prompts, args.steps, graphs) for _ in range(args.reps)]
                rows.setdefault(k, {})[f"decode b{bsz}"] = rates(work, secs)
        if args.reference and bsz == 1:
            ref = base.with_backends(engine="reference")
            with torch.no_grad():
                cache = ref.new_cache(1, 256)
                nxt = ref.prefill(prompts, cache=cache, last_only=True).argmax(-1)
                ref.decode_step(nxt, cache)
                with Stopwatch(GPU) as sw:
                    for _ in range(8):
                        nxt = ref.decode_step(nxt, cache).argmax(-1)
            rows.setdefault("requant reference (before)", {})["decode b1"] = rates(8, [sw.seconds])
        if hf is not None:
            transformers_decode(hf, prompts, 2)
            secs = [transformers_decode(hf, prompts, args.steps) for _ in range(args.reps)]
            rows.setdefault("transformers bf16", {})[f"decode b{bsz}"] = rates(work, secs)
        log(
            f"{name} decode b{bsz}: "
            + ", ".join(f"{k} {r[f'decode b{bsz}']['median']:.0f}" for k, r in rows.items() if f"decode b{bsz}" in r)
        )
        if bsz in (1, 64):
            entry["decode_profile"][f"b{bsz}"] = _guard(decode_profile, base, prompts)
    hf = None
    gc.collect()
    torch.cuda.empty_cache()
    if args.invariance:
        entry["invariance"] = _guard(
            invariance,
            base,
            args.backends[1] if len(args.backends) > 1 else None,
            a.vocab,
        )
        log(f"{name} invariance: {entry['invariance']}")
    entry["prices"] = _guard(prices, base, args.reps)
    log(f"{name} prices: {entry['prices']}")
    base.impl.layout.decoders.clear()
    return entry


def markdown(record: dict) -> str:
    lines = [
        "# requant runtime, fast engine: benchmark",
        "",
        "```bash",
        record["command"],
        "```",
        "",
        f"- commit {record.get('commit')}; {record['environment']}",
        (
            f"- prefill: last logits only; decode: prompts of {record['settings']['prompt_len']} random ids, "
            f"{record['settings']['steps']} timed greedy steps; tokens/s, median of {record['settings']['reps']} [min-max]"
        ),
        "",
    ]
    if record.get("determinism_default") and "error" not in record["determinism_default"]:
        lines += [
            "`requant determinism` (run_determinism, embedded default, 8 prompts x 64 tokens, both regimes and "
            "backends, batch and alone) per engine: "
            + "; ".join(
                f"{k}: {v['seconds']} s, {v['summary']}, batch-invariant {v['batch_invariant']}"
                for k, v in record["determinism_default"].items()
            ),
            "",
        ]
    for e in record["shapes"]:
        lines += [
            f"## {e['shape']}",
            "",
            (
                f"{e['config']}; weights read per decode step {e['weight_bytes_per_step'] / 1e9:.2f} GB "
                f"= {e['weight_read_bound_ms']:.2f} ms at {record['settings']['hbm'] / 1e12:.1f} TB/s"
            ),
            "",
        ]
        keys = []
        for r in e["rows"].values():
            keys += [k for k in r if k not in keys]
        cells = [
            [name, *(f"{r[k]['median']:.0f} [{r[k]['min']:.0f}-{r[k]['max']:.0f}]" if k in r else "" for k in keys)]
            for name, r in e["rows"].items()
        ]
        lines += [*table(["engine", *keys], cells, align="l" + "r" * len(keys)), ""]
        hf = e["rows"].get("transformers bf16")
        if hf:
            lines += [
                "Ratio to transformers bf16 (median tokens/s):",
                "",
            ]
            cells = [
                [name, *(f"{r[k]['median'] / hf[k]['median']:.2f}x" if k in r and k in hf else "" for k in keys)]
                for name, r in e["rows"].items()
                if name != "transformers bf16"
            ]
            lines += [*table(["engine", *keys], cells, align="l" + "r" * len(keys)), ""]
        for b, prof in e.get("prefill_profile", {}).items():
            total = sum(v for v in prof.values() if isinstance(v, float))
            lines += [
                f"Prefill {b} GPU time ({e.get('profile_backend')}): {total:.2f} ms: "
                + "; ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in prof.items()),
                "",
            ]
        for b, prof in e.get("decode_profile", {}).items():
            total = sum(v for v in prof.values() if isinstance(v, float))
            lines += [
                f"Decode GPU time per eager step ({e.get('profile_backend', 'cutlass')}), {b}: {total:.2f} ms: "
                + "; ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in prof.items()),
                "",
            ]
        if e.get("invariance"):
            lines += [
                "Invariance (bitwise): " + "; ".join(f"{k}: {v}" for k, v in e["invariance"].items()),
                "",
            ]
        if e.get("prices"):
            lines += [
                "Price of invariance (ms, median): " + "; ".join(f"{k}: {v}" for k, v in e["prices"].items()),
                "",
            ]
    return "\n".join(lines) + "\n"
