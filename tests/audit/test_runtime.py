"""audit/runtime.py and audit/capture.py on the embedded default (requant.DEFAULT_CHECKPOINT).

References: RoPE against the complex-rotation formula; RMSNorm against its definition;
the pow2 regime against requant.arms.requantize and kernels.bf16.is_power_of_two; the
captured operands against kernels.quantize_activations."""

import pytest
import torch

from requant import kernels
from requant.audit.capture import CALIBRATION_PROMPTS, Capture, prompts, run_prompts, tokenizer_for
from requant.audit.runtime import Qwen3W8A8, dense_names, load_dense, load_linears, rms_norm, rope
from requant.kernels.bf16 import bitwise_equal, is_power_of_two
from requant import DEFAULT_CHECKPOINT
from requant.arms import requantize
from requant.checkpoint import open_checkpoint
from requant.qwen3 import Qwen3Arch


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def dense(ckpt):
    return load_dense(ckpt, "cpu")


def test_rope_convention():
    """Rotate-half RoPE (HF Qwen3): position 0 is the identity; pair (i, i + d/2) of position t
    is rotated by t * theta**(-2i/d): x = e_i goes to (cos, sin) of that angle."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 8, generator=g).to(torch.bfloat16)
    assert bitwise_equal(rope(x, 10000.0), x)
    e = torch.zeros(4, 1, 8, dtype=torch.bfloat16)
    e[:, 0, 1] = 1.0
    got = rope(e, 10000.0)
    ang = torch.arange(4, dtype=torch.float32) * (1.0 / (10000.0 ** torch.tensor(2 / 8, dtype=torch.float32)))
    assert bitwise_equal(got[:, 0, 1], ang.cos().to(torch.bfloat16))
    assert bitwise_equal(got[:, 0, 5], ang.sin().to(torch.bfloat16))
    assert int((got != 0).sum()) <= 8  # nothing else moves (signed zeros aside)


def test_rms_norm_definition():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    w = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    y = rms_norm(x, w, 0.0)
    want = torch.tensor([[3.0, 4.0]]) / (12.5 ** 0.5)
    assert bitwise_equal(y, (want.to(torch.bfloat16).to(torch.float32) * torch.tensor([1.0, 2.0])).to(torch.bfloat16))


def test_runtime_reads_every_tensor_of_the_default(ckpt):
    used = set(dense_names(ckpt.config, set(ckpt.quantized_linears)))
    for n in ckpt.quantized_linears:
        used |= {n + ".weight", n + ".weight_scale"}
    assert used == set(ckpt.tensor_names())
    assert list(Qwen3Arch.from_config(ckpt.config).linear_shapes()) == ckpt.quantized_linears


def test_pow2_regime_is_the_nearest_arm(ckpt):
    lin = load_linears(ckpt, "pow2", "cpu")
    for n in ckpt.quantized_linears[:3]:
        q, s = requantize(*ckpt.weight_and_scale(n), "nearest")
        assert torch.equal(lin[n][0], q) and torch.equal(lin[n][1], s.to(torch.float32).reshape(-1, 1))
        assert bool(is_power_of_two(lin[n][1]).all())


def test_capture_shares_operands_and_pow2_logits_are_equal(ckpt, dense):
    encode, kind = tokenizer_for(ckpt.path, 512)
    assert kind == "byte-level" and encode("Hé") == [72, 195, 169]
    toks = [encode(p) for p in prompts(2)]
    model = Qwen3W8A8(ckpt.config, dense, load_linears(ckpt, "pow2", "cpu"))
    cap = Capture()
    la = run_prompts(model, toks, "reference-cutlass-order", cap, "cpu")
    lb = run_prompts(model, toks, "reference-triton-order", None, "cpu")
    assert la.shape == (sum(map(len, toks)), 512)
    assert bitwise_equal(la, lb)  # every layer bitwise equal under pow2 -> equal logits
    assert bitwise_equal(la, run_prompts(model, toks, "reference-cutlass-order", None, "cpu"))  # deterministic
    ops = cap.operands()
    p = "model.layers.0."
    assert ops[p + "self_attn.q_proj"] is ops[p + "self_attn.k_proj"] is ops[p + "self_attn.v_proj"]
    assert ops[p + "mlp.gate_proj"] is ops[p + "mlp.up_proj"]
    assert ops[p + "mlp.down_proj"].a.shape == (sum(map(len, toks)), 768)
    # the first layer's input is the embedding's RMSNorm: recompute and quantize it
    x = torch.cat([rms_norm(dense["model.embed_tokens.weight"][torch.tensor(t)], dense[p + "input_layernorm.weight"], 1e-6) for t in toks])
    q, s = kernels.quantize_activations(x, backend="reference")
    assert torch.equal(ops[p + "self_attn.q_proj"].a, q) and torch.equal(ops[p + "self_attn.q_proj"].s_a, s)


def test_prompt_count_bounds():
    assert prompts(len(CALIBRATION_PROMPTS)) == list(CALIBRATION_PROMPTS)
    with pytest.raises(ValueError):
        prompts(0)
    with pytest.raises(ValueError):
        prompts(len(CALIBRATION_PROMPTS) + 1)


def test_packed_prompts_equal_separate_prompts(ckpt, dense):
    """Packing (block-diagonal causal mask, positions restarting per prompt) equals running
    each prompt alone, bit for bit on this CPU (the reference GEMM is exact per row)."""
    encode, _ = tokenizer_for(None, 512)
    toks = [torch.tensor(encode(p)) for p in prompts(3)]
    model = Qwen3W8A8(ckpt.config, dense, load_linears(ckpt, "native", "cpu"))
    packed = model.forward(toks, "reference-triton-order")
    alone = torch.cat([model.forward([t], "reference-triton-order") for t in toks])
    assert packed.shape == alone.shape
    assert bitwise_equal(packed, alone)
