"""The benchmarks' timers, in one place: wall-clock seconds around GPU work (the device
synchronised before and after), host microseconds (timeit), CUDA-graph replays timed with CUDA
events, and the median-with-spread summaries the reports print.

Contract: every timer returns plain floats (seconds, unless the name says ms or us); a summary
keeps its raw repetitions beside the median, min and max, so a reader can recompute it
(tests/benchmarks/test_plumbing.py does, and tests/benchmarks/test_bench_runtime.py checks the
records built from it). Synchronisation is a no-op on the CPU, so the same code times both.
"""

from __future__ import annotations

import statistics
import time
import timeit

import torch

__all__ = [
    "FALLBACK",
    "GRAPH",
    "Stopwatch",
    "graph_ms",
    "host_us",
    "median_ms",
    "per_call",
    "rates",
    "repeat",
    "summary",
    "sync",
    "transformers_decode",
]

GRAPH = "cuda-graph"
FALLBACK = "do_bench-fallback"


def sync(device=None) -> None:
    """Wait for the GPU when `device` is a CUDA device (any CUDA device when None and one exists)."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """`with Stopwatch(device) as sw: ...` then `sw.seconds`: the block's wall time, the device
    synchronised on entry and on exit (so queued GPU work is inside the measurement)."""

    def __init__(self, device=None):
        self.device = device
        self.seconds: float | None = None

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._t


def repeat(fn, reps: int, device=None) -> list[float]:
    """Seconds of `reps` calls of fn, each timed on its own."""
    out = []
    for _ in range(reps):
        with Stopwatch(device) as sw:
            fn()
        out.append(sw.seconds)
    return out


def per_call(fn, reps: int, n: int = 20, device=None) -> list[float]:
    """Seconds per call of fn, n calls back to back per repetition (kernel time, not one sync
    per call), after one untimed warm-up call."""
    fn()
    out = []
    for _ in range(reps):
        with Stopwatch(device) as sw:
            for _ in range(n):
                fn()
        out.append(sw.seconds / n)
    return out


def summary(values: list[float]) -> dict:
    """{"median", "min", "max", "reps"} of the repetitions (the median of an even count is the
    mean of the middle two)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "reps": values}


def rates(work: float, secs: list[float]) -> dict:
    """{"median", "min", "max"} of work / seconds (e.g. tokens/s) over the repetitions."""
    v = [work / s for s in secs]
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def median_ms(secs: list[float]) -> float:
    return 1e3 * statistics.median(secs)


def host_us(fn, number: int, repeats: int = 5) -> float:
    """Microseconds per call of fn on the host: the best of `repeats` timeit runs of `number`
    calls (the minimum: host noise only ever adds)."""
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def graph_ms(fns, rep: float, batches: int = 5) -> tuple[float, str]:
    """(ms per call, method) of the calls in `fns` (one per operand copy), captured once in a
    CUDA graph and replayed: the median over `batches` batches of replays, each batch about
    rep / batches ms, timed with CUDA events. method is GRAPH; FALLBACK when the capture
    failed and triton.testing.do_bench timed fns[0] alone (no operand rotation, L2-warm):
    callers must label such points."""
    for f in fns:  # compile / build / warm outside the capture
        f()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
    except Exception as e:  # pragma: no cover - fall back, and say so in the output
        from triton.testing import do_bench

        print("graph capture failed, using do_bench:", type(e).__name__, e, flush=True)
        return do_bench(fns[0], warmup=max(5, rep // 5), rep=rep, return_mode="median"), FALLBACK
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = max(1, int(rep / batches / once))
    times = []
    for _ in range(batches):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (reps * len(fns)))
    del g
    return sorted(times)[batches // 2], GRAPH


def transformers_decode(model, prompts: list[torch.Tensor], steps: int) -> float:
    """Seconds of `steps` greedy decode steps of a transformers causal LM with its DynamicCache,
    after an untimed prefill of the batch (equal-length prompts: no padding)."""
    import warnings

    from transformers import DynamicCache

    # `past_key_values` is deprecated in transformers 5.24 (renamed `cache`) but is the only
    # name 5.17 (the GPU machine's) knows
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
    ids = torch.stack(prompts)
    with torch.no_grad():
        try:
            cache = DynamicCache(config=model.config)
        except TypeError:  # older signature
            cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        with Stopwatch(ids.device) as sw:
            for _ in range(steps):
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return sw.seconds
