"""vLLM as the client of requant's checkpoints: greedy generations through vLLM's CUTLASS and
Triton int8 paths, the weight scales vLLM holds, and agreement with requant's fast engine.

    python3 -m benchmarks.vllm_client one --model DIR --kernel cutlass|triton --out RUN.json
    python3 -m benchmarks.vllm_client compare RUN.json ... --out vllm_compare.json
    python3 -m benchmarks.vllm_client requant --model DIR --runs CUTLASS_RUN.json --out X.json

`one` runs in its own process per (checkpoint, kernel): the kernel is chosen by
`LLM(linear_backend=...)` and vLLM reads its environment at import. Prompts go in as token ids
(the audit's calibration prompts through the checkpoint's tokenizer, or byte ids when it has
none), 64 new tokens, temperature 0, the chosen token's logprob kept; each prompt alone and all
in one batch. With multiprocessing off the engine core runs in this process, so `apply_model`
reads each quantized Linear's weight scale as vLLM holds it, compared bit for bit with the file.

Not bitwise by design: vLLM beside requant's fast engine (other attention and norm arithmetic);
`requant` reports top-1 agreement and greedy token agreement only. Never run in CI (needs vLLM
and a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["main"]

NEW_TOKENS = 64
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_USE_DEEP_GEMM": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not carried (greedy needs no top-k/top-p sampler)
}


def prompt_ids(model_dir: Path, n: int) -> list[list[int]]:
    from requant.models.prompts import prompts
    from requant.models.tokenizer import load_tokenizer
    from requant.runtime.weights import arch_from_config

    cfg = json.loads((model_dir / "config.json").read_text())
    tok = load_tokenizer(model_dir, arch_from_config(cfg).vocab, byte_level=True)
    return [tok.encode(t) for t in prompts(n)]


def file_scales(model_dir: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k.endswith(".weight_scale"):
                    out[k[: -len(".weight_scale")]] = st.get_tensor(k).float().flatten()
    return out


def held_scales(model) -> dict:
    """Each quantized module's weight scale as vLLM holds it (fused q/k/v and gate/up stacked)."""
    out = {}
    for name, mod in model.named_modules():
        s = getattr(mod, "weight_scale", None)
        if s is not None:
            out[name] = s.detach().float().flatten().cpu()
    return out


def scales_equal(held: dict, wanted: dict) -> dict:
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    import torch

    checked, differ = 0, []
    for name, s in held.items():
        prefix, _, last = name.rpartition(".")
        parts = [f"{prefix}.{p}" for p in fused.get(last, (last,))]
        if not all(p in wanted for p in parts):
            continue
        want = torch.cat([wanted[p] for p in parts])
        checked += 1
        if s.shape != want.shape or not torch.equal(s.view(torch.int32), want.view(torch.int32)):
            differ.append(name)
    return {"modules_checked": checked, "modules_differ": differ, "equal": checked > 0 and not differ}


def run_one(args) -> int:
    os.environ.update(OFFLINE)
    from vllm import LLM, SamplingParams

    model_dir = Path(args.model)
    ids = prompt_ids(model_dir, args.prompts)
    llm = LLM(
        model=str(model_dir),
        dtype="bfloat16",
        enforce_eager=True,
        linear_backend=args.kernel,
        skip_tokenizer_init=True,  # token ids in and out: no tokenizer needed
        max_model_len=1024,
        gpu_memory_utilization=0.5,
        seed=0,
    )
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, detokenize=False, ignore_eos=True)

    def gen(batch):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], sp, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(d[t].logprob) if d and t in d else None for t, d in zip(c.token_ids, c.logprobs or [])]
            res.append({"tokens": list(c.token_ids), "logprobs_hex": [x.hex() if x is not None else None for x in lps]})
        return res

    batched = gen(ids)
    alone = [gen([p])[0] for p in ids]
    scales = scales_equal(llm.apply_model(held_scales)[0], file_scales(model_dir))
    result = {
        "model": str(model_dir),
        "kernel": args.kernel,
        "vllm": __import__("vllm").__version__,
        "prompts": ids,
        "batched": batched,
        "alone": alone,
        "weight_scales": scales,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{model_dir.name} {args.kernel}: scales equal {scales['equal']} ({scales['modules_checked']} modules)")
    return 0


def first_diff(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(args) -> int:
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    by_model: dict = {}
    for r in runs:
        by_model.setdefault(r["model"], {})[r["kernel"]] = r
    table = {}
    for model, kernels in by_model.items():
        row = {}
        for k, r in kernels.items():
            row[f"{k}_alone_vs_batched"] = sum(
                a["tokens"] != b["tokens"] or a["logprobs_hex"] != b["logprobs_hex"]
                for a, b in zip(r["alone"], r["batched"])
            )
        if {"cutlass", "triton"} <= kernels.keys():
            c, t = kernels["cutlass"]["batched"], kernels["triton"]["batched"]
            row["prompts"] = len(c)
            row["tokens_differ"] = sum(a["tokens"] != b["tokens"] for a, b in zip(c, t))
            row["logprobs_differ"] = sum(a["logprobs_hex"] != b["logprobs_hex"] for a, b in zip(c, t))
            row["first_token_divergence"] = [first_diff(a["tokens"], b["tokens"]) for a, b in zip(c, t)]
        table[model] = row
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))
    return 0


def beside_requant(args) -> int:
    import torch

    from requant.runtime import load_model

    run = json.loads(Path(args.runs).read_text())
    # Triton rather than CUTLASS spares the CUTLASS build; under pow2 requant's two give the same bits.
    m = load_model(args.model, regime="pow2", backend="triton", act_backend="triton", device="cuda", engine="fast")
    ids = run["prompts"]
    gen = m.generate(ids, max_new_tokens=NEW_TOKENS).ids
    agree = [sum(x == y for x, y in zip(a, b["tokens"])) for a, b in zip(gen, run["batched"])]
    top1 = []
    for p, b in zip(ids, run["batched"]):
        logits = m.logits([p + b["tokens"][:-1]])[0]
        pred = torch.argmax(logits[len(p) - 1 :], dim=-1).tolist()
        top1.append(sum(x == y for x, y in zip(pred, b["tokens"])) / len(b["tokens"]))
    out = {"greedy_tokens_equal": agree, "tokens_per_prompt": NEW_TOKENS, "top1_agreement_on_vllm_tokens": top1}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("one")
    one.add_argument("--model", required=True)
    one.add_argument("--kernel", choices=("cutlass", "triton"), required=True)
    one.add_argument("--prompts", type=int, default=8)
    one.add_argument("--out", required=True)
    cmp = sub.add_parser("compare")
    cmp.add_argument("runs", nargs="+")
    cmp.add_argument("--out", required=True)
    rq = sub.add_parser("requant")
    rq.add_argument("--model", required=True)
    rq.add_argument("--runs", required=True)
    rq.add_argument("--out", required=True)
    args = ap.parse_args()
    return {"one": run_one, "compare": compare, "requant": beside_requant}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
