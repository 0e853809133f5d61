"""benchmarks/_vllm_speed_engines.py's requant engine on the CPU (TRITON_INTERPRET=1, the MICRO
synthetic): the decode loop it times decodes what `generate` decodes, id for id, in every
repetition, with the rows prefilled in groups; so the timed steps are the real
greedy steps; the transformers engine's path runs. The vLLM engines need vLLM and a GPU (benchmarks/gpu_vllm.sh, STAGE=speed)."""

import importlib
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from requant.kernels.triton import _launch  # noqa: E402

if not _launch.INTERPRET:
    pytest.skip("Triton was imported without TRITON_INTERPRET=1", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    from requant.checkpoint.synthetic import generate
    from tests.requant.conftest import MICRO

    return generate(MICRO, tmp_path_factory.mktemp("micro") / "micro", seed=1)


@pytest.fixture(scope="module")
def engine(micro_path):
    eng = importlib.import_module("benchmarks._vllm_speed_engines")
    ns = types.SimpleNamespace(model=str(micro_path), requant_backend="reference-triton-order", device="cpu")
    return eng.RequantEngine(ns)


def test_the_timed_decode_is_generate(engine, monkeypatch):
    eng = importlib.import_module("benchmarks._vllm_speed_engines")
    monkeypatch.setattr(eng, "PREFILL_GROUP_TOKENS", 8)  # rows 0 and 1 in one group, row 2 alone
    rng = random.Random(0)
    vocab = engine.model.arch.vocab
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (3, 4, 9)]
    steps = 2
    want = engine.model.generate([torch.tensor(p) for p in prompts], max_new_tokens=steps + 1).ids
    secs = engine.decode(prompts, steps, 2)
    assert len(secs) == 2 and min(secs) > 0
    assert engine.rep_ids == [want, want]
    engine.done_case()


def test_the_transformers_engine_runs_its_cases(micro_path):
    """The bf16 engine's code path on the CPU (MICRO's config, random init): seconds per
    repetition, and the cases it refuses named."""
    eng = importlib.import_module("benchmarks._vllm_speed_engines")
    hf = eng.TransformersEngine(types.SimpleNamespace(model=str(micro_path), device="cpu"))
    assert hf.prefill([1, 2, 3, 4]) > 0
    assert len(hf.decode([[1, 2, 3], [4, 5, 6]], 2, 3)) == 3
    with pytest.raises(RuntimeError, match="skipped: 2 x"):
        hf.decode([[1] * (eng.HF_MAX_TOKENS // 2 + 1)] * 2, 2, 1)


def test_the_plan_runs_end_to_end_on_the_cpu(micro_path, tmp_path):
    """`all` as the GPU runs it (a subprocess per engine, the records, the report), with the
    cheapest engine on the CPU and tiny cases."""
    out = tmp_path / "speed"
    cmd = [sys.executable, "-m", "benchmarks.vllm_speed", "all", "--model", str(micro_path), "--out", str(out)]
    cmd += ["--engines", "transformers", "--device", "cpu", "--prefill", "8", "--batches", "1,2", "--contexts", "16"]
    cmd += ["--steps", "2", "--reps", "2"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((out / "vllm_speed.json").read_text())
    (run,) = rec["runs"]
    assert run["process_rc"] == 0 and run["errors"] == {} and run["device"] == "cpu"
    assert sorted(run["results"]) == sorted(rec["cases"]) == ["decode b1 c16", "decode b2 c16", "prefill 8"]
    assert all(r["tok_s"]["n"] == 2 for r in run["results"].values())
    assert (out / "vllm_speed.md").read_text().count("\n| decode b") == 2
