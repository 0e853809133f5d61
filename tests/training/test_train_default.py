"""training/train_default.py on the CPU: the tiny model trains 3 steps and writes its outputs;
a second run with the same seed writes the same weights; the schedule, the batches and the
validation windows are what the docstring says; bad input is one line and exit 2.
Independent references: transformers' own Qwen3ForCausalLM / from_pretrained (tensor names,
config reading, a pure-bf16 evaluation of the saved file), hashlib, numpy slicing of the
token stream, and closed-form schedule values."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from training import arch, tokens, train_default

from .conftest import TINY_ARGS, train_tiny


def test_tiny_run_writes_its_outputs(tiny_run):
    names = {p.name for p in tiny_run.iterdir()}
    assert names == {"model.safetensors", "config.json", "train_log.jsonl", "summary.json", "loss.png"}
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["planned_steps"] == 3 and summary["stop"] == "horizon"
    assert summary["tokens_seen"] == 3 * 2 * 64 and summary["seed"] == 0
    assert summary["deterministic"] == "strict" and summary["data"]["stream_sha256_pinned"] is True
    assert summary["weights_sha256"] == hashlib.sha256((tiny_run / "model.safetensors").read_bytes()).hexdigest()
    assert 0 < summary["best_val_loss"] < math.log(8192) + 0.5 and summary["best_step"] in (0, 2, 3)
    assert summary["files"] == ["model.safetensors", "config.json", "train_log.jsonl", "summary.json", "loss.png"]
    rows = [json.loads(line) for line in (tiny_run / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(
        {"step", "lr", "train_loss", "tokens_per_s", "elapsed_s", "tokens_seen", "epoch"} <= set(r) for r in rows[1:]
    )
    assert [("val_loss" in r) for r in rows] == [True, False, True, True]  # initial, every 2 steps and at the end
    assert abs(rows[0]["val_loss"] - math.log(8192)) < 0.1  # the initial model is close to uniform
    assert min(r["val_loss"] for r in rows if "val_loss" in r) == summary["best_val_loss"]
    assert (tiny_run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saved_weights_are_a_transformers_qwen3(tiny_run):
    """Names, dtypes and shapes as transformers' own Qwen3ForCausalLM has them (lm_head tied,
    not stored), and from_pretrained on the output directory reproduces the summary's
    pure-bf16 validation loss."""
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    cfg = json.loads((tiny_run / "config.json").read_text())
    assert cfg == arch.config_dict(arch.TINY) and cfg["rope_theta"] == 1e6 and cfg["tie_word_embeddings"] is True
    ref = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).state_dict()
    with safe_open(str(tiny_run / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        saved = {k: f.get_tensor(k) for k in f.keys()}
    assert set(saved) == set(ref) - {"lm_head.weight"}
    n_ref = sum(p.numel() for p in transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).parameters())
    assert json.loads((tiny_run / "summary.json").read_text())["parameters"] == n_ref == arch.parameter_count(arch.TINY)
    assert all(saved[k].dtype == torch.bfloat16 and saved[k].shape == ref[k].shape for k in saved)

    model = transformers.Qwen3ForCausalLM.from_pretrained(str(tiny_run), dtype=torch.bfloat16)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.model.embed_tokens.weight, saved["model.embed_tokens.weight"])
    val = torch.from_numpy(tokens.token_streams()["val"].astype(np.int64))
    windows = tokens.val_windows(val, 64, 4)
    nll = 0.0
    with torch.no_grad():
        for w in windows:
            logits = model(input_ids=w[None, :-1]).logits.float()[0]
            nll += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert nll / (4 * 64) == pytest.approx(summary["best_val_loss_bf16"], rel=1e-5)


def test_same_seed_same_weights(tiny_run, tmp_path):
    again = train_tiny(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (tiny_run / "model.safetensors").read_bytes()
    other = train_tiny(tmp_path / "seed1", "--seed", "1")
    assert (other / "model.safetensors").read_bytes() != (tiny_run / "model.safetensors").read_bytes()


def test_learning_rate_schedule():
    lr = [train_default.lr_at(s, 1.0, 10, 110, 0.1) for s in range(0, 130)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert lr[10] == pytest.approx(1.0) and lr[60] == pytest.approx(0.55) and lr[110] == pytest.approx(0.1)
    assert lr[129] == pytest.approx(0.1) and all(a >= b for a, b in zip(lr[10:], lr[11:]))


def test_batches_are_stream_windows():
    stream = torch.arange(1000, dtype=torch.int32)
    b1, b2 = tokens.Batches(stream, 16, 4, seed=3), tokens.Batches(stream, 16, 4, seed=3)
    per_epoch = b1.steps_per_epoch()
    assert per_epoch == ((1000 - 16) // 16) // 4
    starts = []
    for _ in range(per_epoch):
        x = b1.next()
        assert torch.equal(x, b2.next()) and x.dtype == torch.int64 and x.shape == (4, 17)
        for row in x:
            s = int(row[0])
            assert row.tolist() == np.arange(s, s + 17).tolist()  # consecutive tokens of the stream
            starts.append(s)
    offsets = {s % 16 for s in starts}
    assert len(offsets) == 1 and len(set(starts)) == len(starts)  # one offset, no window twice in an epoch
    assert b1.epoch == 1


def test_validation_windows_cover_every_target_once():
    stream = torch.arange(1, 300, dtype=torch.int32)
    wins = tokens.val_windows(stream, 64)
    assert torch.cat([w[1:] for w in wins]).tolist() == stream[1:].tolist()
    assert [len(w) for w in wins] == [65, 65, 65, 65, 43]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--seq-len", "0"], "--seq-len must be at least 1"),
        (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "mps"], "--device"),
        (["--max-steps", "0"], "--max-steps must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, extra, message):
    args = ["--out", str(tmp_path / "o"), *TINY_ARGS, *extra]
    assert train_default.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert train_default.main(["--out", str(tmp_path / "f"), *TINY_ARGS]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert (tmp_path / "f").read_text() == "x"
