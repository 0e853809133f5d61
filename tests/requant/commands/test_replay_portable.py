"""`requant replay` of records made by the portable engine: made on the CPU by its torch form and by
its Triton kernels (under TRITON_INTERPRET=1, the GPU's program), replayed on the CPU by the torch
form, alone and in a batch; and the refusals (another engine, an unknown arithmetic, a portable
record without one). GPU-made records committed under tests/data/gpu_records: test_gpu_records.py.

References: the record itself (the tokens, digests and logprobs another implementation computed);
for the refusals, the exit code 2 and the one line naming the field or option.
"""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.requant.commands.cli import invoke


def _prompts_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def default_record(tmp_path_factory):
    d = tmp_path_factory.mktemp("portable")
    prompts = _prompts_file(
        d / "p.jsonl",
        [{"prompt": "To bake bread,"}, {"prompt": "The sea", "temperature": 0.9, "top_p": 0.95, "seed": 11}],
    )
    out = d / "rec.jsonl"
    res = invoke(
        "generate", "--prompts", prompts, "--engine", "portable", "--device", "cpu", "--max-new-tokens", 6,
        "--no-eos", "--json", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return out


def test_cpu_record_replays_alone_and_in_a_batch(default_record, tmp_path):
    recs = [json.loads(line) for line in default_record.read_text().splitlines()]
    assert all(r["engine"] == "portable" and r["arithmetic"] == "portable/1" for r in recs)
    assert all(r["portable_kernels"] == "torch" for r in recs)
    res = invoke("replay", default_record, "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "2/2 records match bit for bit" in res.stdout
    res = invoke("replay", default_record, "--device", "cpu", "--batch-with", 3)
    assert res.exit_code == 0, res.output


def test_record_of_the_triton_kernels_replays_on_the_torch_form(tmp_path, monkeypatch):
    from requant.checkpoint.synthetic import generate
    from tests.requant.conftest import MICRO

    ckpt = generate(MICRO, tmp_path / "micro", seed=2)
    prompts = _prompts_file(
        tmp_path / "p.jsonl",
        [{"prompt_ids": [3, 9, 27, 4, 5]}, {"prompt_ids": [7, 1], "temperature": 1.0, "seed": 5}],
    )
    out = tmp_path / "rec.jsonl"
    monkeypatch.setenv("REQUANT_PORTABLE_KERNELS", "triton")
    res = invoke(
        "generate", ckpt, "--prompts", prompts, "--engine", "portable", "--backend", "triton", "--regime", "pow2",
        "--device", "cpu", "--max-new-tokens", 3, "--no-eos", "--json", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    monkeypatch.delenv("REQUANT_PORTABLE_KERNELS")
    first = json.loads(out.read_text().splitlines()[0])
    assert (first["backend"], first["portable_kernels"]) == ("triton", "triton")
    res = invoke("replay", out, "--device", "cpu", "--batch-with", 1)  # the torch form, reference-triton-order
    assert res.exit_code == 0, res.output
    assert "2/2 records match bit for bit" in res.stdout


def _edit(src, dst, **fields):
    lines = []
    for line in src.read_text().splitlines():
        rec = json.loads(line)
        for k, v in fields.items():
            if v is None:
                rec.pop(k, None)
            else:
                rec[k] = v
        lines.append(json.dumps(rec))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_refusals(default_record, tmp_path):
    res = invoke("replay", default_record, "--device", "cpu", "--engine", "reference")
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1].startswith("error: ") and "--engine portable" in res.output
    bad = _edit(default_record, tmp_path / "a.jsonl", arithmetic="portable/0")
    res = invoke("replay", bad, "--device", "cpu")
    assert res.exit_code == 2 and "field 'arithmetic' is 'portable/0'" in res.output
    bad = _edit(default_record, tmp_path / "b.jsonl", arithmetic=None)
    res = invoke("replay", bad, "--device", "cpu")
    assert res.exit_code == 2 and "field 'arithmetic' is missing" in res.output
