"""GPU tests of verifiable generation (marker `gpu`; skipped without CUDA): records made with
CUTLASS on the fast engine at batch 1 (CUDA graphs) replayed with Triton inside a batch of 17.

References: under pow2, CUTLASS and Triton give the same logits bits (docs/kernels.md), so every
step must match (exit 0), greedy and sampled; under native, a direct comparison of the two
kernels' logits with the recorded tokens forced (Model.generate(keep_logits=True, choose=...),
torch.equal per step) gives the step that replay must report (none: exit 0). The chooser on
CUDA against the same chooser on the CPU copy of the logits (and choose_row / row_logprob on a
few rows): the same tokens, logprobs and digests.
Run: python3 -m pytest -q -m gpu tests/requant/commands/test_replay_gpu.py
"""

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("CUTLASS is sm90a only", allow_module_level=True)

from requant import DEFAULT_CHECKPOINT
from tests.requant.commands.cli import invoke

pytestmark = pytest.mark.gpu
NEW = 32
PROMPT = "To bake bread, mix flour, water, salt and yeast, then let the dough rise."
MODES = {"greedy": [], "sampled": ["--temperature", "0.8", "--top-p", "0.95", "--seed", "3"]}


def make(tmp_path, regime, mode):
    out = tmp_path / f"{regime}-{mode}.jsonl"
    res = invoke("generate", "--prompt", PROMPT, "--max-new-tokens", NEW, "--no-eos", "--regime", regime,
                 "--backend", "cutlass", "--engine", "fast", "--device", "cuda", *MODES[mode], "--json", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cutlass_record_replays_with_triton_in_a_batch_of_17_under_pow2(tmp_path, mode):
    rec = make(tmp_path, "pow2", mode)
    res = invoke("replay", rec, "--backend", "triton", "--batch-with", 16, "--device", "cuda")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("mode", sorted(MODES))
def test_native_reports_the_first_difference(tmp_path, mode):
    from requant.runtime import load_model

    path = make(tmp_path, "native", mode)
    rec = json.loads(path.read_text())
    out = tmp_path / "r.json"
    res = invoke("replay", path, "--backend", "triton", "--batch-with", 16, "--device", "cuda", "--json", out)
    a = load_model(DEFAULT_CHECKPOINT, backend="cutlass", device="cuda", engine="fast")
    b = a.with_backends("triton")
    ids = rec["ids"]

    def force(step, lg):
        return torch.tensor([ids[step]], device=lg.device)

    la = a.generate([rec["prompt_ids"]], NEW, keep_logits=True, choose=force).step_logits
    lb = b.generate([rec["prompt_ids"]], NEW, keep_logits=True, choose=force).step_logits
    step = next((i for i, (x, y) in enumerate(zip(la, lb)) if not torch.equal(x, y)), None)
    data = json.loads(out.read_text())
    if step is None:
        assert res.exit_code == 0 and data["ok"], res.output
    else:
        assert res.exit_code == 1, res.output
        assert data["records"][0]["first_difference"]["step"] == step


def test_cuda_chooser_equals_the_cpu_chooser_at_batch_64_and_the_8b_vocabulary():
    import random

    from requant.runtime.sampling import Chooser, SamplingParams, choose_row, row_logprob

    rng = random.Random(64)
    g = torch.Generator().manual_seed(64)
    scale = torch.tensor([rng.choice([0.01, 1.0, 4.0, 12.0]) for _ in range(64)])[:, None]
    logits = (torch.randn(64, 151936, generator=g) * scale).to(torch.bfloat16).to(torch.float32)
    logits[0] = 0.0  # flat: the draw reaches past the first prefix of the order
    logits[1, 5] = logits[1, 9] = logits[1].max()  # tied maxima
    reqs = [
        SamplingParams(
            rng.choice([0.0, 0.05, 0.7, 1.0, 2.0]),
            rng.choice([0, 0, 1, 50, 3000]),
            rng.choice([1.0, 0.9, 0.95, 1e-9]),
            rng.randrange(2**64),
            f"gpu-{j}",
        )
        for j in range(64)
    ]
    reqs[0] = SamplingParams(1.0, 0, 1.0, 1, "flat")
    lengths = [rng.randrange(1, 4000) for _ in range(64)]
    cpu, gpu = Chooser(reqs, lengths), Chooser(reqs, lengths)
    for step in range(2):
        want = cpu(step, logits)
        got = gpu(step, logits.cuda())
        assert got.device.type == "cuda" and torch.equal(got.cpu(), want)
    assert gpu.steps == cpu.steps  # tokens, positions, logits digests, logprobs
    for j in (0, 1, 2, 63):
        s = gpu.steps[j][1]
        assert s.token == choose_row(logits[j], reqs[j], lengths[j] + 1)
        assert s.logprob == row_logprob(logits[j], s.token).hex()
