"""The engines benchmarks/vllm_speed.py times, one per process (`run`): vLLM (plain or batch-invariant,
the mode comes from the environment), requant's fast engine, transformers bf16. Each gives the
seconds of a prefill up to its first token and of `steps` decode steps; `measure` turns them into
the record. Needs a GPU (and vLLM for the vLLM engines): never imported by CI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks._timing import sync
from benchmarks.vllm_client import OFFLINE
from benchmarks.vllm_speed import LABELS, decode_prompt_len, prompt_ids, stats

# requant's prefill of a batch goes in groups of at most this many tokens (activation memory)
PREFILL_GROUP_TOKENS = 32768
# transformers re-prefills every repetition (no prefix cache): cases above this many prompt tokens
# are skipped for it
HF_MAX_TOKENS = 65536

TIMING = {
    "vllm": {
        "prefill": "LLM.generate(max_tokens=1) wall, one request of fresh ids (prefix cache never hits)",
        "decode": "LLM.generate(max_tokens=1+steps) - LLM.generate(max_tokens=1) wall, same prompts, prefix cache warm",
    },
    "requant": {
        "prefill": "Model.prefill(last_only=True) + argmax + .item(), CUDA-synchronised wall",
        "decode": "decoder CUDA graph replayed `steps` times, argmax fed back, ids read every 16 steps",
    },
    "transformers": {
        "prefill": "forward(logits_to_keep=1) + argmax + .item(), CUDA-synchronised wall",
        "decode": "`steps` forwards with DynamicCache, argmax fed back (_timing.transformers_decode)",
    },
}


class VllmEngine:
    def __init__(self, a):
        os.environ.update({k: v for k, v in OFFLINE.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"})
        import vllm
        from vllm import LLM, SamplingParams

        self.SamplingParams = SamplingParams
        kw = {
            "model": a.model,
            "dtype": "bfloat16",
            "skip_tokenizer_init": True,  # token ids in and out: synthetic checkpoints have no tokenizer
            "seed": 0,
            "gpu_memory_utilization": a.gpu_memory_utilization,
        }
        if a.no_compile:  # CUDA graphs without torch.compile: FULL graphs for decode batches only
            kw["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
        t = time.perf_counter()
        self.llm = LLM(**kw)
        self.info = {
            "startup_s": round(time.perf_counter() - t, 1),
            "compile": not a.no_compile,
            "llm_kwargs": kw,
            "versions": {"vllm": vllm.__version__},
            "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0"),
            "config": _vllm_config(self.llm),
        }

    def _gen(self, prompts, n: int) -> float:
        sp = self.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        secs = time.perf_counter() - t
        got = sorted({len(o.outputs[0].token_ids) for o in outs})
        if got != [n]:
            raise RuntimeError(f"vLLM returned {got} tokens per request, asked {n}")
        return secs

    def prefill(self, ids) -> float:
        return self._gen([ids], 1)

    def decode(self, prompts, steps: int, reps: int) -> list[float]:
        self._gen(prompts, 1 + steps)  # warm: the prefix cache and this batch's graphs
        out = []
        for _ in range(reps):
            first = self._gen(prompts, 1)
            out.append(self._gen(prompts, 1 + steps) - first)
        return out

    def done_case(self):
        pass


def _vllm_config(llm) -> dict:
    """What vLLM chose (best effort: the attribute path differs between versions)."""
    try:
        c = llm.llm_engine.vllm_config
        cc = c.compilation_config
        return {
            "max_num_batched_tokens": c.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": c.scheduler_config.max_num_seqs,
            "max_model_len": c.model_config.max_model_len,
            "enable_prefix_caching": c.cache_config.enable_prefix_caching,
            "compilation_mode": str(cc.mode),
            "cudagraph_mode": str(cc.cudagraph_mode),
            "quantization": str(c.model_config.quantization),
        }
    except Exception as exc:  # noqa: BLE001 (recorded)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


class RequantEngine:
    def __init__(self, a):
        import torch

        import requant
        from requant.runtime import load_model

        self.device = getattr(a, "device", "cuda")  # "cpu": the tests, under TRITON_INTERPRET=1
        t = time.perf_counter()
        self.model = load_model(
            a.model, regime="pow2", backend=a.requant_backend, act_backend="triton", device=self.device, engine="fast"
        )
        from benchmarks._runtime_fast import weight_bytes

        self.torch = torch
        self.rep_ids: list[list[list[int]]] = []  # the last decode's ids, per repetition and row
        self.info = {
            "startup_s": round(time.perf_counter() - t, 1),
            "backend": a.requant_backend,
            "graphs": True,
            "versions": {"requant": getattr(requant, "__version__", "?"), "torch": torch.__version__},
            "weight_bytes_per_step": weight_bytes(self.model),  # what one decode step must read
        }

    def prefill(self, ids) -> float:
        torch = self.torch
        x = torch.tensor(ids, device=self.device)
        sync(self.device)
        t = time.perf_counter()
        with torch.no_grad():
            int(self.model.prefill([x], last_only=True).argmax(-1)[0])
        return time.perf_counter() - t

    def decode(self, prompts, steps: int, reps: int) -> list[float]:
        torch = self.torch
        fw = self.model.impl
        b, lens = len(prompts), [len(p) for p in prompts]
        dec = fw.decoder(b, max(lens) + steps + 8, graphs=True)
        dev = self.device
        first = torch.empty(b, dtype=torch.long, device=dev)
        with torch.no_grad():
            j = 0
            while j < b:  # rows in groups: the prefill's activations of 64 x 4k tokens need not fit at once
                k = j + max(1, PREFILL_GROUP_TOKENS // lens[j])
                group = [(r, 0, torch.tensor(prompts[r], device=dev)) for r in range(j, min(k, b))]
                first[j : j + len(group)] = fw._run(group, dec.cache.k, dec.cache.v, last_only=True).argmax(-1)
                j += len(group)
            dec.cache.lengths[:b] = lens
            dec.start(lens)
            start = dec.pos.clone()
            dec.tok[:b] = first
            dec.step()
            dec.step()  # eager first step, then the capture and one replay
            out = []
            self.rep_ids = []
            for _ in range(reps):
                dec.pos.copy_(start)  # every repetition decodes the same ids at the same positions
                dec.tok[:b] = first
                rows = [[t] for t in first.tolist()]
                sync(dev)
                t = time.perf_counter()
                pending, nxt = [], None
                for i in range(steps):
                    nxt = dec.step(nxt).argmax(-1)
                    pending.append(nxt)
                    if len(pending) == 16 or i == steps - 1:  # generate's host read (sync_every)
                        for row, new in zip(rows, torch.stack(pending, 1).tolist()):
                            row += new
                        pending.clear()
                out.append(time.perf_counter() - t)
                self.rep_ids.append(rows)
        return out

    def done_case(self):
        self.model.impl.layout.decoders.clear()
        self.torch.cuda.empty_cache()


class TransformersEngine:
    def __init__(self, a):
        import torch
        import transformers

        cfg = json.loads((Path(a.model) / "config.json").read_text())
        cfg = {k: v for k, v in cfg.items() if k not in ("quantization_config", "architectures", "model_type")}
        config = transformers.Qwen3Config(**cfg, attn_implementation="sdpa")
        self.device = getattr(a, "device", "cuda")  # "cpu": the tests
        t = time.perf_counter()
        with torch.device(self.device):
            self.hf = transformers.Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
        self.torch = torch
        self.info = {
            "startup_s": round(time.perf_counter() - t, 1),
            "weights": "random init of the checkpoint's config (speed only)",
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        }

    def prefill(self, ids) -> float:
        torch = self.torch
        x = torch.tensor([ids], device=self.device)
        sync(self.device)
        t = time.perf_counter()
        with torch.no_grad():
            int(self.hf(input_ids=x, logits_to_keep=1, use_cache=False).logits[0, -1].argmax())
        return time.perf_counter() - t

    def decode(self, prompts, steps: int, reps: int) -> list[float]:
        from benchmarks._timing import transformers_decode

        if len(prompts) * len(prompts[0]) > HF_MAX_TOKENS:
            raise RuntimeError(f"skipped: {len(prompts)} x {len(prompts[0])} prompt tokens re-prefilled per repetition")
        x = [self.torch.tensor(p, device=self.device) for p in prompts]
        transformers_decode(self.hf, x, 2)
        return [transformers_decode(self.hf, x, steps) for _ in range(reps)]

    def done_case(self):
        self.torch.cuda.empty_cache()


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


ENGINE_CLASSES = {
    "vllm": VllmEngine,
    "vllm-bi": VllmEngine,
    "requant": RequantEngine,
    "transformers": TransformersEngine,
}


def measure(a) -> int:
    """One engine, every case of a.case_list; the record is rewritten after each case (a run cut by
    its time limit keeps what it measured). 0: every case measured, 1: some failed, 2: no engine."""
    vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
    rec = {
        "engine": a.engine,
        "label": LABELS[a.engine],
        "model": a.model,
        "commit": os.environ.get("REQUANT_COMMIT"),
        "settings": {"steps": a.steps, "reps": a.reps, "vocab": vocab},
        "timing": TIMING["vllm" if a.engine.startswith("vllm") else a.engine],
        "results": {},
        "errors": {},
    }
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def flush():
        path.write_text(json.dumps(rec, indent=1) + "\n")

    try:
        eng = ENGINE_CLASSES[a.engine](a)
    except Exception as exc:  # noqa: BLE001 (recorded, the plan goes on)
        rec["errors"]["startup"] = f"{type(exc).__name__}: {exc}"[:1000]
        flush()
        return 2
    rec.update(eng.info)
    rec["device"] = _device_name()
    flush()
    for i, c in enumerate(a.case_list):
        try:
            if c.kind == "prefill":
                eng.prefill(prompt_ids(vocab, c.length, 10_000 + c.length))  # warm-up
                secs = [eng.prefill(prompt_ids(vocab, c.length, 20_000 + 97 * r + c.length)) for r in range(a.reps)]
                rec["results"][c.key] = {
                    "tok_s": stats([c.length / s for s in secs]),
                    "ttft_ms": stats([1e3 * s for s in secs]),
                }
            else:
                n = decode_prompt_len(c.length, a.steps)
                prompts = [prompt_ids(vocab, n, 1000 * i + row) for row in range(c.batch)]
                secs = eng.decode(prompts, a.steps, a.reps)
                rec["results"][c.key] = {
                    "tok_s": stats([c.batch * a.steps / s for s in secs]),
                    "ms_per_step": 1e3 * stats(secs)["median"] / a.steps,
                    "prompt_len": n,
                }
        except Exception as exc:  # noqa: BLE001 (recorded per case)
            rec["errors"][c.key] = f"{type(exc).__name__}: {exc}"[:1000]
        eng.done_case()
        print(f"{a.engine} {c.key}: {rec['results'].get(c.key) or rec['errors'].get(c.key)}", flush=True)
        flush()
    return 1 if rec["errors"] else 0
