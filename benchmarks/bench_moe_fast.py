"""The fast engine on a Qwen3-MoE checkpoint (GPU; benchmarks/gpu_moe.sh, step "fast"): alone ==
batched (prefill and greedy generation), prefill in chunks == decode, pow2 CUTLASS == Triton on
the fast engine, the distance to the reference engine's logits, and the wall time of both engines.

    python3 benchmarks/bench_moe_fast.py CKPT --json OUT.json [--tokens 8]

Exit 0 when every bitwise property holds, 1 when one does not (each is in the JSON), 2 when it
cannot run. Not a CI test: tests/requant/runtime/test_fast_moe.py is (the Triton interpreter).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

PROMPTS = ["The experts of a mixture", "A router sends each token to eight experts, and", "Power-of-two scales"]


def _same(a, b) -> bool:
    from requant.kernels.bf16 import bitwise_equal

    return a.shape == b.shape and bitwise_equal(a, b)


def _timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, round(time.perf_counter() - t0, 3)


def run(ckpt: str, tokens: int) -> dict:
    from requant.runtime import load_model

    fast = load_model(ckpt, regime="pow2", backend="triton", engine="fast", device="cuda")
    ids = [torch.tensor(list(p.encode())) for p in PROMPTS]  # byte ids: every vocabulary has them
    out: dict = {"checkpoint": ckpt, "device": torch.cuda.get_device_name(), "tokens": tokens}
    batch, out["fast_prefill_s"] = _timed(lambda: fast.logits(ids))
    out["alone_equals_batched_prefill"] = all(_same(fast.logits([p])[0], batch[i]) for i, p in enumerate(ids))
    gen, out["fast_generate_s"] = _timed(lambda: fast.generate(ids, tokens, keep_logits=True))
    alone = fast.generate([ids[1]], tokens, keep_logits=True)
    out["alone_equals_batched_generate"] = alone.ids[0] == gen.ids[1] and all(
        _same(alone.step_logits[s][0], gen.step_logits[s][1]) for s in range(tokens)
    )
    seq = torch.cat(ids)
    cache = fast.new_cache(1, 128)
    parts = [fast.extend([seq[:9]], cache), fast.extend([seq[9:20]], cache)]
    parts += [fast.decode_step(seq[j : j + 1], cache) for j in range(20, len(seq))]
    out["chunks_and_decode_equal_prefill"] = _same(torch.cat(parts), fast.logits([seq])[0])
    cut = fast.with_backends(backend="cutlass")
    out["pow2_cutlass_equals_triton_fast"] = all(_same(a, b) for a, b in zip(cut.logits(ids), batch))
    ref = fast.with_backends(engine="reference")
    rl, out["reference_prefill_s"] = _timed(lambda: ref.logits(ids))
    _, out["reference_generate_s"] = _timed(lambda: ref.generate(ids, tokens))
    o, r = torch.cat(batch), torch.cat(rl)
    out["fast_vs_reference"] = {
        "bitwise_equal": _same(o, r),
        "rms_over_std": float((o - r).pow(2).mean().sqrt() / r.std()),
        "argmax_agreement": float((o.argmax(-1) == r.argmax(-1)).float().mean()),
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_moe_fast: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = run(args.ckpt, args.tokens)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    checks = [k for k, v in out.items() if isinstance(v, bool)]
    return 0 if all(out[k] for k in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
