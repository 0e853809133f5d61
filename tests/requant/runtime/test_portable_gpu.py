"""The portable arithmetic on a GPU (marker `gpu`; skipped without CUDA): the compiled Triton kernels
against the torch specification run on the CPU, bit for bit, and generation records made on the GPU
replayed on the CPU (and a CPU record replayed on the GPU).

References: kernels/portable.py evaluated on the CPU (another machine's arithmetic: what the test
is about); for records, the replay on the other device. REQUANT_GPU_RECORDS=DIR keeps the GPU-made
records there (tests/data/gpu_records/README.md says how they are committed).
Run: python3 -m pytest -q -m gpu tests/requant/runtime/test_portable_gpu.py tests/kernels/test_portable.py
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from requant import DEFAULT_CHECKPOINT
from requant.kernels import portable as P
from requant.kernels.triton import portable as TP
from tests.requant.commands.cli import invoke

pytestmark = pytest.mark.gpu
CUTLASS = torch.cuda.get_device_capability() == (9, 0)
BACKENDS = ["triton"] + (["cutlass"] if CUTLASS else [])


def bits(t):
    t = t.detach().cpu()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def test_exp_every_pattern_of_minus_150_to_0_and_a_grid_above():
    # every fp32 bit pattern in [-150, -0] (about 1.09e9), in chunks; the spec on the CPU. Chunks of
    # 2^20 keep the spec's temporaries in cache: 64 M patterns took 17.4 s in chunks of 2^26 and 2.1 s
    # in chunks of 2^20 on a 2-core CPU (the test took 85 s on the GPU machine with 2^26).
    top = 0xC3160000  # -150.0
    step = 1 << 20
    for lo in range(0x80000000, top + 1, step):
        pat = torch.arange(lo, min(lo + step, top + 1), dtype=torch.int64)
        x = (pat - 2**32).to(torch.int32).view(torch.float32)
        for base_e, fn in ((False, P.exp2), (True, P.exp)):
            got = TP.elementwise_exp(x.cuda(), base_e=base_e).cpu()
            want = fn(x)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (hex(lo), base_e)
    x = torch.cat([torch.linspace(0, 128, 1_000_001), torch.tensor([1e-40, -1e-40, float("nan"), float("inf")])])
    for base_e, fn in ((False, P.exp2), (True, P.exp)):
        assert torch.equal(bits(TP.elementwise_exp(x.cuda(), base_e=base_e)), bits(fn(x)))


def _adversarial(g, *shape, scale=1.0):
    x = torch.randn(*shape, generator=g) * scale
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randperm(n, generator=g)
    flat[idx[: n // 50]] = 0.0
    flat[idx[n // 50 : n // 25]] *= 2.0**-120  # tiny: subnormal products
    flat[idx[n // 25 : n // 20]] *= 2.0**40
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("m", [1, 4, 64, 200])
def test_dense_equals_the_cpu_spec(m):
    g = torch.Generator().manual_seed(m)
    x, w = _adversarial(g, m, 2048), _adversarial(g, 4099, 2048, scale=0.05)
    assert torch.equal(bits(TP.dense(x.cuda(), w.cuda())), bits(P.dense(x, w)))


def test_silu_equals_the_cpu_spec():
    from requant.kernels.reference import quantize_activations

    g = torch.Generator().manual_seed(2)
    gu = _adversarial(g, 37, 2 * 6144, scale=6.0)
    q, s = TP.silu_mul_quantize(gu.cuda())
    wq, ws = quantize_activations(P.silu_mul(gu), check=False)
    assert torch.equal(q.cpu(), wq) and torch.equal(bits(s), bits(ws))


@pytest.mark.parametrize("heads,kv,lengths", [(32, 8, (1, 700, 33)), (16, 8, (600, 5)), (40, 8, (520,))])
def test_attention_equals_the_cpu_spec(heads, kv, lengths):
    g = torch.Generator().manual_seed(heads)
    d, cap = 128, 1024
    rows = len(lengths)
    kc = _adversarial(g, rows, kv, cap, d)
    vc = _adversarial(g, rows, kv, cap, d)
    pos, row, blocks, off = [], [], [], 0
    per = TP.tokens_per_block(heads, kv)
    for r, n in enumerate(lengths):
        pos += list(range(n))
        row += [r] * n
        blocks += [(off + i, min(per, n - i), r) for i in range(0, n, per)]
        off += n
    pos_t = torch.tensor(pos, dtype=torch.int32)
    rows_t = torch.tensor(row, dtype=torch.int32)
    q = _adversarial(g, len(pos), heads, d)
    got = TP.attention(
        q.cuda(), kc.cuda(), vc.cuda(), pos_t.cuda(), torch.tensor(blocks, dtype=torch.int32).cuda(), d**-0.5
    )
    want = P.attention(q, kc, vc, pos_t, rows_t, d**-0.5)
    assert torch.equal(bits(got), bits(want))


def test_attention_tokens_per_program_and_warps_change_no_bit(monkeypatch):
    """The prefill launch's tokens per program (PREFILL_TOKENS) and warps, as benchmarks/bench_portable.py
    --tokens sweeps them, each equal to the CPU spec computed once (Qwen3's 4 query heads per KV head
    and head_dim 128 on 2 KV heads, to keep the spec cheap; two sequences across the 512-position split)."""
    heads, kv, d, cap, lengths = 8, 2, 128, 640, (530, 17)
    g = torch.Generator().manual_seed(5)
    kc = _adversarial(g, len(lengths), kv, cap, d)
    vc = _adversarial(g, len(lengths), kv, cap, d)
    pos = [p for n in lengths for p in range(n)]
    row = [r for r, n in enumerate(lengths) for _ in range(n)]
    pos_t, rows_t = torch.tensor(pos, dtype=torch.int32), torch.tensor(row, dtype=torch.int32)
    q = _adversarial(g, len(pos), heads, d)
    want = bits(P.attention(q, kc, vc, pos_t, rows_t, d**-0.5))
    for tokens, warps in [(None, 4), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8)]:
        monkeypatch.setattr(TP, "PREFILL_TOKENS", tokens)
        monkeypatch.setattr(TP, "WARPS", warps)
        per = TP.tokens_per_block(heads, kv)
        blocks, off = [], 0
        for r, n in enumerate(lengths):
            blocks += [(off + i, min(per, n - i), r) for i in range(0, n, per)]
            off += n
        blocks_t = torch.tensor(blocks, dtype=torch.int32).cuda()
        got = TP.attention(q.cuda(), kc.cuda(), vc.cuda(), pos_t.cuda(), blocks_t, d**-0.5)
        assert torch.equal(bits(got), want), (tokens, warps)


# -- records ------------------------------------------------------------------------------------
PROMPTS = [
    {"prompt": "To bake bread,"},
    {"prompt": "The sea was", "temperature": 0.8, "top_p": 0.95, "seed": 7},
    {"prompt": "Once upon a time", "temperature": 1.0, "top_k": 40, "seed": 8},
    {"prompt": "In 1905,"},
]


def _keep(path: Path):
    keep = os.environ.get("REQUANT_GPU_RECORDS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regime", ["pow2", "native"])
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_record_replays_on_the_cpu(tmp_path, backend, regime, batch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:batch]))
    out = tmp_path / f"default-{backend}-{regime}-b{batch}.jsonl"
    res = invoke("generate", "--prompts", prompts, "--engine", "portable", "--backend", backend, "--regime", regime,
                 "--device", "cuda", "--max-new-tokens", 16, "--no-eos", "--json", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["portable_kernels"] == "triton" and rec["device"].startswith("cuda")
    _keep(out)
    res = invoke("replay", out, "--device", "cpu")
    assert res.exit_code == 0, res.output
    res = invoke("replay", out, "--device", "cpu", "--batch-with", 3)
    assert res.exit_code == 0, res.output


def test_cpu_record_replays_on_the_gpu(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "cpu.jsonl"
    res = invoke("generate", "--prompts", prompts, "--engine", "portable", "--device", "cpu",
                 "--max-new-tokens", 12, "--no-eos", "--json", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    for extra in ([], ["--backend", "triton", "--batch-with", 5]):  # the emulation on CUDA; the Triton GEMM
        res = invoke("replay", out, "--device", "cuda", *extra)
        assert res.exit_code == 0, res.output


def test_graphs_and_eager_and_the_cpu_give_the_same_logits():
    from requant.runtime import load_model
    from requant.runtime.portable import with_kernels

    gpu = load_model(DEFAULT_CHECKPOINT, regime="pow2", backend="triton", device="cuda", engine="portable")
    cpu = load_model(DEFAULT_CHECKPOINT, regime="pow2", device="cpu", engine="portable")
    assert with_kernels(cpu, "torch").impl.kernels == "torch"
    ids = [gpu.tokenizer.encode(p["prompt"]) for p in PROMPTS]
    a = gpu.generate(ids, 10, keep_logits=True, graphs=True)
    b = gpu.generate(ids, 10, keep_logits=True, graphs=False)
    c = cpu.generate(ids, 10, keep_logits=True)
    assert a.ids == b.ids == c.ids
    for x, y, z in zip(a.step_logits, b.step_logits, c.step_logits):
        assert torch.equal(bits(x), bits(y)) and torch.equal(bits(x), bits(z))
