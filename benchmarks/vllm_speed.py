"""requant's fast engine beside vLLM 0.26 on one checkpoint: prefill tokens/s and
time to first token, decode tokens/s, each engine in its own process, one after the other.

    python3 -m benchmarks.vllm_speed all --model DIR --out DIR [--engines requant,vllm,vllm-bi]
        [--no-compile vllm-bi] [--reps 5] [--steps 32]       # the plan, one subprocess per engine
    python3 -m benchmarks.vllm_speed run --engine E --model DIR --out RUN.json [--no-compile]
    python3 -m benchmarks.vllm_speed plan [--engines ...]  # print the plan as JSON (CPU)

Engines: `vllm` (vLLM's defaults: torch.compile, CUDA graphs, its CUTLASS W8A8, prefix caching),
`vllm-bi` (the same with VLLM_BATCH_INVARIANT=1), `requant` (the fast engine, --requant-backend,
CUDA graphs), `transformers` (bf16 Qwen3ForCausalLM, SDPA, random init of the checkpoint's config:
speed only). --no-compile ENGINES runs those vLLM modes without torch.compile (mode NONE, CUDA
graphs FULL_DECODE_ONLY: compiling an 8B model can take minutes); each record says which.

How each figure is timed (every run also writes it in its record's "timing"):
  * prefill 1 x N: wall time, CUDA-synchronised, of one request of N fresh random ids (a new seed
    each repetition, so vLLM's prefix cache never hits) up to its first token on the host: vLLM
    `LLM.generate(max_tokens=1)`; requant `Model.prefill(last_only=True)` + argmax + `.item()`;
    transformers `forward(logits_to_keep=1)` + argmax. That time is the time to first token (TTFT);
    prefill tokens/s = N / TTFT.
  * decode batch B at context C: B prompts of C - steps - 8 random ids (distinct rows), then `steps`
    greedy tokens, so every step attends to at most C positions. vLLM: `LLM.generate` with
    max_tokens = 1 + steps minus `LLM.generate` with max_tokens = 1 on the same prompts, both
    after a warm-up that fills the prefix cache (the difference is `steps` decode steps with vLLM's
    scheduler, sampler and output processing); requant: its decoder's CUDA graph replayed `steps`
    times with the argmax fed back and the ids read on the host every 16 steps, as
    `generate` does (the prompts prefilled once, the positions reset each repetition);
    transformers: `steps` forwards with its DynamicCache (benchmarks/_timing.transformers_decode).
    tokens/s = B * steps / seconds.
Median of --reps with [min-max]. vLLM runs with its environment's defaults otherwise (multiprocessing
engine core); the offline settings of vllm_client.OFFLINE minus VLLM_ENABLE_V1_MULTIPROCESSING.
Never run in CI (vLLM and a GPU); the plan, the arguments and the report are CPU-tested.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ENGINES", "Case", "Run", "cases", "plan", "prompt_ids", "decode_prompt_len", "stats", "main"]

ENGINES = ("vllm", "vllm-bi", "requant", "transformers")
LABELS = {
    "vllm": "vLLM 0.26",
    "vllm-bi": "vLLM 0.26, VLLM_BATCH_INVARIANT=1",
    "requant": "requant fast engine",
    "transformers": "transformers bf16",
}
# Seconds each engine's process may take at the default cases (startup + compile + measurement);
# with torch.compile the default plan (requant, vllm, vllm-bi) may pass 600 s: gpu_vllm.sh runs it under
# setsid (BACKGROUND=1) and brings it back with STAGE=collect.
LIMIT_S = {"vllm": 300, "vllm-bi": 300, "requant": 240, "transformers": 150}
PREFILL = (2048, 8192)
BATCHES = (1, 8, 64)
CONTEXTS = (128, 4096)
HEADROOM = 8  # decode positions kept free at the end of the context (requant's capacity = C)


@dataclasses.dataclass(frozen=True)
class Case:
    """One figure: a prefill of `length` tokens, or `batch` rows decoding up to context `length`."""

    kind: str  # "prefill" or "decode"
    length: int
    batch: int = 1

    @property
    def key(self) -> str:
        return f"prefill {self.length}" if self.kind == "prefill" else f"decode b{self.batch} c{self.length}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One engine's process: its environment additions, compile setting and time limit."""

    engine: str
    env: dict
    compile: bool
    limit_s: int

    def argv(self, model: str, out: str, common: list[str]) -> list[str]:
        cmd = [sys.executable, "-m", "benchmarks.vllm_speed", "run", "--engine", self.engine, "--model", model]
        cmd += ["--out", out, *common]
        return cmd + ([] if self.compile else ["--no-compile"])


def cases(prefill=PREFILL, batches=BATCHES, contexts=CONTEXTS) -> list[Case]:
    """Prefills first (shortest first), then decode by context and batch."""
    out = [Case("prefill", n) for n in sorted(prefill)]
    return out + [Case("decode", c, b) for c in sorted(contexts) for b in sorted(batches)]


def decode_prompt_len(context: int, steps: int) -> int:
    n = context - steps - HEADROOM
    if n < 1:
        raise ValueError(f"context {context}: no room for a prompt before {steps} steps (+{HEADROOM})")
    return n


def plan(engines, no_compile=(), limits: dict | None = None) -> list[Run]:
    """The runs, in order: one process per engine (vLLM reads its environment at import)."""
    bad = [e for e in [*engines, *no_compile] if e not in ENGINES]
    if bad:
        raise ValueError(f"unknown engine {bad[0]!r}: expected some of {', '.join(ENGINES)}")
    lim = {**LIMIT_S, **(limits or {})}
    return [
        Run(e, {"VLLM_BATCH_INVARIANT": "1"} if e == "vllm-bi" else {}, _compiles(e, no_compile), lim[e])
        for e in engines
    ]


def _compiles(engine: str, no_compile) -> bool:
    """Whether the engine's run uses torch.compile: vLLM's modes unless named in no_compile."""
    return engine.startswith("vllm") and engine not in no_compile


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    """`length` ids drawn uniformly from [0, vocab) by a seeded generator (the same on any machine)."""
    r = random.Random(seed)
    return [r.randrange(vocab) for _ in range(length)]


def _median(v: list[float]) -> float:
    s = sorted(v)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2


def stats(values: list[float]) -> dict:
    return {"median": _median(values), "min": min(values), "max": max(values), "n": len(values)}


def _fail(msg: str):
    """Bad arguments: one line on stderr, exit status 2 (could not run)."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _csv(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"--{name} {text!r}: expected comma-separated integers")
    if not vals or min(vals) < 1:
        _fail(f"--{name} {text!r}: expected positive integers")
    return vals


def _names(text: str, name: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in ENGINES]
    if bad:
        _fail(f"--{name} {bad[0]!r}: expected some of {', '.join(ENGINES)}")
    return vals


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.vllm_speed", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("all", "run", "plan"):
        p = sub.add_parser(name)
        if name != "plan":
            p.add_argument("--model", required=True, help="the checkpoint directory (pow2, converted)")
            p.add_argument("--out", required=True, help="all: a directory; run: the record's JSON path")
        p.add_argument("--prefill", default=",".join(map(str, PREFILL)))
        p.add_argument("--batches", default=",".join(map(str, BATCHES)))
        p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
        p.add_argument("--steps", type=int, default=32, help="decode steps timed per repetition")
        p.add_argument("--reps", type=int, default=5)
        p.add_argument("--requant-backend", default="triton", help="requant's GEMM backend (cutlass needs its build)")
        p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM's share of the GPU")
        p.add_argument("--device", default="cuda", help="requant, transformers: cpu runs the plan on the CPU (tests)")
        if name == "run":
            p.add_argument("--engine", choices=ENGINES, required=True)
            p.add_argument("--no-compile", action="store_true", help="vLLM: no torch.compile (CUDA graphs kept)")
        else:
            p.add_argument("--engines", default="requant,vllm,vllm-bi")
            p.add_argument("--no-compile", default="", help="engines run without torch.compile (comma-separated)")
            p.add_argument("--limit-s", default="", help="ENGINE=SECONDS,... per-process limits (default LIMIT_S)")
            p.add_argument("--budget-s", type=int, default=0, help="all: seconds for the whole plan (0: no budget)")
    return ap


def _limits(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        eng, _, secs = item.partition("=")
        if eng not in ENGINES or not secs.isdigit():
            _fail(f"--limit-s {item!r}: expected ENGINE=SECONDS with ENGINE one of {ENGINES}")
        out[eng] = int(secs)
    return out


def parse(argv=None) -> argparse.Namespace:
    """The arguments, checked: lists parsed into .case_list (and .plan for all/plan)."""
    a = parser().parse_args(argv)
    if a.steps < 1 or a.reps < 1:
        _fail("--steps and --reps must be at least 1")
    a.case_list = cases(_csv(a.prefill, "prefill"), _csv(a.batches, "batches"), _csv(a.contexts, "contexts"))
    for c in a.case_list:
        if c.kind == "decode":
            try:
                decode_prompt_len(c.length, a.steps)
            except ValueError as exc:
                _fail(f"--contexts: {exc}")
    if a.cmd != "run":
        engines = _names(a.engines, "engines")
        a.plan = plan(engines, _names(a.no_compile, "no-compile"), _limits(a.limit_s))
    return a


def run_limit(limit_s: int, budget_s: int, elapsed: float, least: int = 30) -> int | None:
    """A run's time limit: its own, cut to what is left of the budget (5 s kept for the report);
    None when less than `least` seconds would be left (the run is skipped)."""
    if budget_s <= 0:
        return limit_s
    left = int(budget_s - elapsed - 5)
    return None if left < least else min(limit_s, left)


def common_args(a) -> list[str]:
    """The measurement arguments every run of the plan shares."""
    return [
        "--prefill", a.prefill, "--batches", a.batches, "--contexts", a.contexts, "--steps", str(a.steps),
        "--reps", str(a.reps), "--requant-backend", a.requant_backend,
        "--gpu-memory-utilization", str(a.gpu_memory_utilization), "--device", a.device,
    ]  # fmt: skip


def run_process(argv: list[str], env: dict, log: Path, limit: int) -> int | str:
    """argv in a session of its own, output to `log`; its exit status, or "timeout after N s".
    The whole session is killed after it (vLLM's engine core is a child process: a stray one would
    keep GPU memory from the next run)."""
    with open(log, "w") as f:
        p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = f"timeout after {limit} s"
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the session ended with its leader's children
        p.wait()
    return rc


def run_all(a) -> int:
    """Each run of the plan in its own process (its log beside its record), then vllm_speed.json."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    t0 = time.perf_counter()
    for r in a.plan:
        path = out / f"run_{r.engine}.json"
        limit = run_limit(r.limit_s, a.budget_s, time.perf_counter() - t0)
        t = time.perf_counter()
        if limit is None:
            rc = "skipped: the budget is spent"
        else:
            argv = r.argv(a.model, str(path), common_args(a))
            rc = run_process(argv, {**os.environ, **r.env}, out / f"run_{r.engine}.log", limit)
        secs = round(time.perf_counter() - t, 1)
        rec = json.loads(path.read_text()) if path.exists() else {"engine": r.engine, "label": LABELS[r.engine]}
        rec.update({"process_rc": rc, "process_s": secs, "limit_s": limit})
        records.append(rec)
        print(f"{r.engine}: rc {rc} in {secs} s", flush=True)
    combined = {
        "tool": "benchmarks/vllm_speed.py",
        "commit": os.environ.get("REQUANT_COMMIT"),
        "model": a.model,
        "cases": [c.key for c in a.case_list],
        "runs": records,
    }
    (out / "vllm_speed.json").write_text(json.dumps(combined, indent=1) + "\n")
    from benchmarks.vllm_speed_report import markdown

    (out / "vllm_speed.md").write_text(markdown(combined))
    return 0 if all(r.get("process_rc") == 0 for r in records) else 1


def main(argv=None) -> int:
    a = parse(argv)
    if a.cmd == "plan":
        print(json.dumps([dataclasses.asdict(r) for r in a.plan], indent=1))
        return 0
    if a.cmd == "all":
        return run_all(a)
    from benchmarks._vllm_speed_engines import measure

    return measure(a)


if __name__ == "__main__":
    sys.exit(main())
