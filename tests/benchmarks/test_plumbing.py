"""The benchmarks' shared plumbing on the CPU: the timers of benchmarks/_timing.py and the Qwen3
GEMM shapes of benchmarks/_qwen3_shapes.py.

Independent references: the shape table is the published Qwen3 configs (hidden_size,
intermediate_size, num_attention_heads, num_key_value_heads, head_dim of Qwen3-1.7B, -8B and
-14B on the Hub), written out here by hand; the summaries are recomputed with sorted() and
arithmetic; the timers are checked against time.sleep of a known length."""

import importlib
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    return importlib.import_module(f"benchmarks.{name}")


# (hidden, intermediate, heads, kv_heads, head_dim) from the published config.json files
PUBLISHED = {
    "Qwen3-1.7B": (2048, 6144, 16, 8, 128),
    "Qwen3-8B": (4096, 12288, 32, 8, 128),
    "Qwen3-14B": (5120, 17408, 40, 8, 128),
}


def test_qwen3_shapes_are_the_published_configs():
    shapes = _load("_qwen3_shapes")
    assert list(shapes.QWEN3) == list(PUBLISHED)
    for model, (h, i, heads, kv, d) in PUBLISHED.items():
        # q: heads*d x h, k and v: kv*d x h, o: h x heads*d, gate and up: i x h, down: h x i
        assert shapes.QWEN3[model] == [
            ("q,o", heads * d, h, 2),
            ("k,v", kv * d, h, 2),
            ("gate,up", i, h, 2),
            ("down", h, i, 1),
        ], model


def test_linear_groups_keep_distinct_shapes_apart():
    """A model whose attention width differs from hidden (Qwen3-0.6B: hidden 1024, 16 x 128
    heads) has q and o of different shapes: they are not merged."""
    shapes = _load("_qwen3_shapes")
    from requant.models.qwen3 import Qwen3Arch

    arch = Qwen3Arch(1024, 3072, 28, 16, 8, 128, 151936, True)
    assert shapes.linear_groups(arch) == [
        ("q", 2048, 1024, 1),
        ("k,v", 1024, 1024, 2),
        ("o", 1024, 2048, 1),
        ("gate,up", 3072, 1024, 2),
        ("down", 1024, 3072, 1),
    ]


def test_summaries_recomputed():
    t = _load("_timing")
    v = [4.0, 1.0, 3.0, 2.0]
    s = t.summary(v)
    assert s == {"median": (2.0 + 3.0) / 2, "min": 1.0, "max": 4.0, "reps": v}
    r = t.rates(12.0, [4.0, 2.0, 3.0])
    assert r == {"median": 12.0 / 3.0, "min": 12.0 / 4.0, "max": 12.0 / 2.0}
    assert t.median_ms([0.003, 0.001, 0.002]) == 1e3 * 0.002


def test_timers_measure_the_work_on_the_cpu():
    t = _load("_timing")
    with t.Stopwatch("cpu") as sw:
        time.sleep(0.02)
    assert 0.02 <= sw.seconds < 0.5
    calls = []
    reps = t.repeat(lambda: (calls.append(1), time.sleep(0.01)), 3, "cpu")
    assert len(reps) == 3 and len(calls) == 3 and all(0.01 <= x < 0.5 for x in reps)
    calls.clear()
    per = t.per_call(lambda: (calls.append(1), time.sleep(0.002)), reps=2, n=5, device="cpu")
    assert len(calls) == 1 + 2 * 5  # one warm-up call, then n per repetition
    assert len(per) == 2 and all(0.002 <= x < 0.1 for x in per)
    assert 1000 <= t.host_us(lambda: time.sleep(0.001), number=3, repeats=2) < 100000
