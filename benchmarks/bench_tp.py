"""Tensor-parallel benchmark: prefill and decode tokens/s of requant.tp at each TP degree,
int32 all-reduce (exact) against bf16 all-reduce (the usual scheme), per backend and regime,
with NCCL's algorithm and channel count varied; and whether the bits moved.

    python3 -m benchmarks.bench_tp CKPT [CKPT ...] --out DIR                       # GPU defaults
    python3 -m benchmarks.bench_tp --device cpu --backends reference-triton-order --tp 1,2 \\
        --batch 2 --prompt-len 16 --new-tokens 4 --reps 1 --nccl default --out DIR    # CPU smoke run

What is measured (requant.tp.launch, one launch per checkpoint and NCCL setting; every
degree runs on ranks 0..d-1 of the same processes):
  * prefill tokens/s: one packed prefill of --batch prompts of --prompt-len random ids
    (seeded), all logits; decode tokens/s: --batch * (--new-tokens - 1) / the time of that
    many greedy decode steps after a cached prefill; both the best of --reps, CUDA-synchronised
    and started together on every rank (a barrier);
  * identical: each run's prefill logits, greedy ids and step logits compared with TP 1 of
    the same variant and NCCL setting through their digests (requant.tp.compare.digest);
  * nccl_invariant: the digest of each (variant, degree) equal under every NCCL setting.
NCCL settings (--nccl, ';'-separated): "default" (NCCL's choice) or comma-separated
NAME=VALUE pairs set as NCCL_NAME before the workers start, e.g. "ALGO=Ring,NCHANNELS=1"
(NCHANNELS sets NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS). NCCL_NVLS_ENABLE=0 always
(NVLink multicast stays off on the lent machines). Writes DIR/bench_tp.json (after every
launch) and DIR/bench_tp.md; progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from requant.io.markdown import table
from requant.io.output import write_bytes_atomic, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent

T0 = time.perf_counter()
NCCL_DEFAULT = "default;ALGO=Ring,NCHANNELS=1;ALGO=Tree,NCHANNELS=1;ALGO=Ring,NCHANNELS=8"


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def nccl_env(setting: str) -> dict[str, str]:
    if setting == "default":
        return {}
    env = {}
    for pair in setting.split(","):
        name, _, value = pair.partition("=")
        if not name or not value:
            raise SystemExit(f"error: --nccl: {pair!r} is not NAME=VALUE")
        if name == "NCHANNELS":
            env["NCCL_MIN_NCHANNELS"] = env["NCCL_MAX_NCHANNELS"] = value
        else:
            env[f"NCCL_{name}"] = value
    return env


def markdown(record: dict) -> str:
    head = (
        f"commit {record['commit']}, device {record['device']}, batch {record['batch']} x {record['prompt_len']} "
        f"tokens, {record['new_tokens']} new tokens, best of {record['reps']}"
    )
    lines = ["# requant.tp benchmark", "", head, ""]
    rows = []
    for row in record["rows"]:
        t = row["timing"]
        inv = row.get("nccl_invariant")
        rows.append(
            [row["checkpoint"], row["nccl"], row["backend"], row["regime"], row["reduce"], row["tp"]]
            + [f"{t.get('prefill_tok_s', 0):.0f}", f"{t.get('decode_tok_s', 0):.1f}"]
            + ["yes" if row["identical"] else "NO", "-" if inv is None else "yes" if inv else "NO"]
        )
    header = ["checkpoint", "NCCL", "backend", "regime", "reduce", "tp", "prefill tok/s", "decode tok/s"]
    lines += table([*header, "= TP 1", "= every NCCL"], rows)
    lines += [
        "",
        (
            "tokens/s with the int32 all-reduce over tokens/s with the bf16 one (same checkpoint, NCCL setting, "
            "backend, regime, tp; 1.000 = no cost):"
        ),
        "",
    ]
    by = {
        (r["checkpoint"], r["nccl"], r["backend"], r["regime"], r["tp"], r["reduce"]): r["timing"]
        for r in record["rows"]
    }
    rows = []
    for (c, n, b, g, tp, red), t in by.items():
        o = by.get((c, n, b, g, tp, "bf16"))
        if red == "int32" and o and t:
            rows.append(
                [c, n, b, g, tp, f"{o['prefill_s'] / t['prefill_s']:.3f}", f"{o['decode_s'] / t['decode_s']:.3f}"]
            )
    lines += table(["checkpoint", "NCCL", "backend", "regime", "tp", "prefill", "decode"], rows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from requant.checkpoint import open_checkpoint
    from requant.evidence.buildinfo import git_commit
    from requant.runtime.weights import arch_from_config
    from requant.tp import LaunchConfig, Spec, check_degree, run

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="W8A8 checkpoint directories (default: the embedded default)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backends", default="cutlass,triton")
    ap.add_argument("--act-backend", default=None, help="default: triton on CUDA, reference on CPU (same bits)")
    ap.add_argument("--regimes", default="native,pow2")
    ap.add_argument("--reduces", default="int32,bf16")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nccl", default=NCCL_DEFAULT, help="';'-separated NCCL settings (module docstring)")
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds per launch")
    args = ap.parse_args(argv)
    from requant import DEFAULT_CHECKPOINT

    ckpts = args.checkpoints or [str(DEFAULT_CHECKPOINT)]
    act = args.act_backend or ("triton" if args.device == "cuda" else "reference")
    degrees = tuple(sorted({1, *(int(x) for x in args.tp.split(","))}))
    runs = tuple(
        LaunchConfig(b, g, red, act)
        for b in args.backends.split(",")
        for g in args.regimes.split(",")
        for red in args.reduces.split(",")
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "commit": os.environ.get("REQUANT_COMMIT") or git_commit(),
        "device": args.device,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if args.device == "cuda"
        else [],
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else None,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "degrees": list(degrees),
        "rows": [],
    }

    def flush():
        write_json_atomic(out / "bench_tp.json", record)
        write_bytes_atomic(out / "bench_tp.md", markdown(record).encode())

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    for path in ckpts:
        arch = arch_from_config(open_checkpoint(path).config)
        for d in degrees:
            check_degree(arch, d)
        g = torch.Generator().manual_seed(0)
        prompts = tuple(
            tuple(torch.randint(0, arch.vocab, (args.prompt_len,), generator=g).tolist()) for _ in range(args.batch)
        )
        name = Path(path).name
        seen: dict[tuple, str] = {}
        for setting in args.nccl.split(";"):
            env = nccl_env(setting)
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            log(f"{name}: NCCL {setting}: {len(runs)} variants x tp {degrees}")
            try:
                res = run(
                    Spec(
                        str(path),
                        prompts,
                        degrees=degrees,
                        runs=runs,
                        new_tokens=args.new_tokens,
                        device=args.device,
                        time_reps=args.reps,
                        keep_logits=False,
                    ),
                    timeout_s=args.timeout,
                )
            except (RuntimeError, TimeoutError) as exc:
                log(f"{name}: NCCL {setting}: FAILED: {exc}")
                record["rows"].append(
                    {
                        "checkpoint": name,
                        "nccl": setting,
                        "error": str(exc),
                        "backend": "-",
                        "regime": "-",
                        "reduce": "-",
                        "tp": 0,
                        "timing": {},
                        "identical": False,
                    }
                )
                flush()
                continue
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            for (r, d), result in sorted(res.items(), key=lambda kv: (runs.index(kv[0][0]), kv[0][1])):
                key = (r, d)
                first = seen.setdefault(key, result.digest)
                row = {
                    "checkpoint": name,
                    "nccl": setting,
                    "backend": r.backend,
                    "regime": r.regime,
                    "reduce": r.reduce,
                    "tp": d,
                    "timing": result.timing,
                    "digest": result.digest,
                    "identical": result.digest == res[(r, 1)].digest,
                    "nccl_invariant": None if setting == args.nccl.split(";")[0] else result.digest == first,
                }
                record["rows"].append(row)
                log(
                    f"  {r.backend} {r.regime} {r.reduce} tp {d}: prefill {result.timing['prefill_tok_s']:.0f} tok/s, "
                    f"decode {result.timing['decode_tok_s']:.1f} tok/s, = TP 1: {row['identical']}"
                )
            flush()
    flush()
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
