"""One step of requant.runtime.sampling's chooser (Chooser(...)(step, logits)) at the 8B vocabulary.

    python3 -m benchmarks.bench_sampling [--out DIR] [--batches 1,8,64] [--vocab 151936]
                                         [--devices cpu,cuda] [--reps 3] [--threads 1]

Per device (cuda only when present), batch and mode, the wall time of one chooser call on fp32
logits already on that device, the device synchronised around it (_timing.repeat), after one
untimed warm-up; the median, min and max of --reps calls, and the median per row. Modes:
greedy (temperature 0) and sampled (temperature 0.8, top_p 0.95, top_k 0, one seed and key a
row), both recording (the logits digest and the logprob of every row, as `requant generate
--json` and `requant replay` do); with a chooser that has record=False, also both without
("greedy-bare", "sampled-bare": `requant generate` without --json). Logits: N(0, 4^2) per entry,
rounded to bf16 (ties, as a model's), one fixed seed.
It runs on any checkout (an older Chooser without `record` is timed in the recording modes),
so the same script gives the before and after figures: PYTHONPATH=<old tree> for before.
Writes DIR/sampling.json (requant.io.output.write_json_atomic) and prints one line per point.
"""

import argparse
import inspect
import os
import platform

import torch

from benchmarks._timing import repeat, summary  # noqa: E402
from requant.io.output import write_json_atomic  # noqa: E402
from requant.runtime.sampling import Chooser, SamplingParams  # noqa: E402

MODES = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.95),
}


def logits_for(batch: int, vocab: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    x = (torch.randn(batch, vocab, generator=g) * 4.0).to(torch.bfloat16).to(torch.float32)
    return x.to(device)


def time_point(device: str, batch: int, vocab: int, mode: str, record: bool, reps: int) -> dict:
    base = MODES[mode.removesuffix("-bare")]
    reqs = [SamplingParams(seed=j, key=f"bench-{j}", **base) for j in range(batch)]
    kwargs = {} if record else {"record": False}
    ch = Chooser(reqs, [100] * batch, **kwargs)
    logits = logits_for(batch, vocab, device)
    steps = iter(range(reps + 1))  # a new step each call: a chooser records a step once
    ch(next(steps), logits)  # warm-up (and the CUDA pinned buffer)
    secs = repeat(lambda: ch(next(steps), logits), reps, device=device)
    s = summary(secs)
    return {
        "device": device,
        "batch": batch,
        "vocab": vocab,
        "mode": mode,
        "record": record,
        "seconds": s,
        "ms_per_row": 1e3 * s["median"] / batch,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--devices", default="cpu,cuda")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: a steadier figure)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bare = "record" in inspect.signature(Chooser).parameters
    modes = [(m, True) for m in MODES] + ([(f"{m}-bare", False) for m in MODES] if bare else [])
    devices = [d for d in args.devices.split(",") if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]
    points = []
    for dev in devices:
        for batch in [int(b) for b in args.batches.split(",")]:
            for mode, record in modes:
                pt = time_point(dev, batch, args.vocab, mode, record, args.reps)
                points.append(pt)
                print(
                    f"{dev:4} batch {batch:3} {mode:12} {1e3 * pt['seconds']['median']:10.2f} ms/step "
                    f"{pt['ms_per_row']:8.2f} ms/row",
                    flush=True,
                )
    res = {
        "tool": "benchmarks/bench_sampling.py",
        "chooser": Chooser.__module__,
        "chooser_has_record": bare,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "gpu": torch.cuda.get_device_name() if "cuda" in devices else None,
        "logits": "N(0, 4^2) rounded to bf16, torch.Generator seed 1234",
        "modes": {k: v for k, v in MODES.items()},
        "points": points,
    }
    path = write_json_atomic(os.path.join(args.out, "sampling.json"), res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
