"""The audit's use of requant.runtime on the embedded default (requant.DEFAULT_CHECKPOINT):
the capture hook and the audit's operands. The runtime itself is tested in
tests/requant/runtime/test_reference.py.

References: the captured operands against kernels.quantize_activations of an RMSNorm
recomputed here from its definition; the pow2 logits of the two emulated orders against
each other (power-of-two scales make the orders agree, kernels/reference.py)."""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT, kernels
from requant.audit.capture import Capture, prompts, run_prompts
from requant.checkpoint import open_checkpoint
from requant.kernels.bf16 import bitwise_equal
from requant.runtime import load_model


@pytest.fixture(scope="module")
def pow2_model():
    return load_model(open_checkpoint(DEFAULT_CHECKPOINT), regime="pow2")


def test_capture_shares_operands_and_pow2_logits_are_equal(pow2_model):
    model = pow2_model
    toks = [model.tokenizer.encode(p) for p in prompts(2)]
    cap = Capture()
    la = run_prompts(model, toks, "reference-cutlass-order", cap)
    lb = run_prompts(model, toks, "reference-triton-order", None)
    assert la.shape == (sum(map(len, toks)), model.arch.vocab)
    assert bitwise_equal(la, lb)  # every layer bitwise equal under pow2 -> equal logits
    assert bitwise_equal(la, run_prompts(model, toks, "reference-cutlass-order", None))  # deterministic
    ops = cap.operands()
    p = "model.layers.0."
    assert ops[p + "self_attn.q_proj"] is ops[p + "self_attn.k_proj"] is ops[p + "self_attn.v_proj"]
    assert ops[p + "mlp.gate_proj"] is ops[p + "mlp.up_proj"]
    assert ops[p + "mlp.down_proj"].a.shape == (sum(map(len, toks)), model.arch.intermediate)
    assert set(ops) == set(model.linears)  # every quantized Linear
    # the first layer's input is the embedding's RMSNorm: recompute it from its definition
    emb = model.dense["model.embed_tokens.weight"][torch.tensor(sum(toks, []))].to(torch.float32)
    h = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)
    x = (model.dense[p + "input_layernorm.weight"].to(torch.float32) * h.to(torch.bfloat16).to(torch.float32)).to(
        torch.bfloat16
    )
    q, s = kernels.quantize_activations(x, backend="reference")
    assert torch.equal(ops[p + "self_attn.q_proj"].a, q) and torch.equal(ops[p + "self_attn.q_proj"].s_a, s)


def test_audit_records_the_tokenizer(default_audit):
    """Reference: requant.models.tokenizer on the same directory (byte-level for the random default,
    tokenizer.json with its digest for a default that ships one)."""
    from requant.models.tokenizer import load_tokenizer

    cfg = open_checkpoint(DEFAULT_CHECKPOINT).config
    assert default_audit["tokenizer"] == load_tokenizer(DEFAULT_CHECKPOINT, cfg["vocab_size"]).describe()


def test_audit_uses_and_records_a_tokenizer_json(tmp_path):
    """A checkpoint with a tokenizer.json: the audit tokenizes with it (reference: the
    `tokenizers` library's encode of the same file) and records its sha256 (hashlib) in
    the JSON and the Markdown report."""
    import hashlib
    import shutil

    from tokenizers import Tokenizer

    from requant.audit.report import markdown
    from requant.audit.suite import run_audit
    from requant.backends import REFERENCE_PAIR
    from tests.requant.toy_tokenizer import write_byte_bpe

    ck = tmp_path / "ck"
    shutil.copytree(DEFAULT_CHECKPOINT, ck)
    path = write_byte_bpe(ck)
    result = run_audit(open_checkpoint(ck), REFERENCE_PAIR, 1, "cpu", keep_cells=False)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert result["tokenizer"]["kind"] == "tokenizer.json" and result["tokenizer"]["sha256"] == digest
    assert result["tokens"] == len(Tokenizer.from_file(str(path)).encode(prompts(1)[0]).ids)
    assert f"tokenizer.json (sha256 {digest}" in markdown(result)


def test_a_broken_tokenizer_is_a_usage_error(tmp_path):
    """A tokenizer.json the `tokenizers` library cannot load: exit 2 with the file named."""
    import shutil

    import typer
    from typer.testing import CliRunner

    from requant.commands.audit import audit

    ck = tmp_path / "ck"
    shutil.copytree(DEFAULT_CHECKPOINT, ck)
    (ck / "tokenizer.json").write_text('{"model": 3}')
    app = typer.Typer(add_completion=False)
    app.command("audit")(audit)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["audit", str(ck), "--prompts", "1"])
    assert res.exit_code == 2 and "tokenizer.json" in res.output and "Traceback" not in res.output


def test_the_collector_is_paused_during_the_audit_and_restored_after(monkeypatch):
    """run_audit runs with Python's cyclic collector off (audit.suite.collector_paused) and leaves
    it as it found it: on, off, and after an error inside."""
    import gc

    from requant.audit import suite

    seen = []

    def fake(*args, **kwargs):
        seen.append(gc.isenabled())
        if kwargs.get("fail"):
            raise RuntimeError("inside")
        return "done"

    wrapped = suite.collector_paused()(fake)
    assert gc.isenabled()
    assert wrapped() == "done" and seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError, match="inside"):
        wrapped(fail=True)
    assert gc.isenabled()
    gc.disable()
    try:
        wrapped()
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        gc.enable()
    assert seen == [False, False, False]
    assert getattr(suite.run_audit, "__wrapped__", None) is not None  # run_audit is wrapped
